//! Whether a tensor's data decodes to finite numbers, read off its float fields only: the
//! elements of F32/F16/BF16, the f16 scales (`d`, and `m` or `dmin`) of the block types
//! [`crate::dequant`] decodes. Integer parts times finite scales are always finite, so a block
//! is finite exactly when its scales are. It decodes nothing.

use crate::types::GgmlType;

/// Where the f16 scales of one block lie, by byte offset (see the layouts in [`crate::dequant`]).
fn scale_offsets(ty: GgmlType) -> Option<&'static [usize]> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q6_K => &[208],
        _ => return None,
    })
}

fn f16_finite(b: &[u8]) -> bool {
    // f16: exponent bits 10..15 all ones is infinity or NaN.
    u16::from_le_bytes([b[0], b[1]]) & 0x7c00 != 0x7c00
}

/// The index of the first element (F32/F16/BF16) or block (quantized types) of `bytes` that
/// holds a NaN or an infinity; `Err(ty)` for a type whose layout is not known here.
pub fn first_non_finite(ty: GgmlType, bytes: &[u8]) -> Result<Option<usize>, GgmlType> {
    let (_, block) = ty.block();
    let mut chunks = bytes.chunks_exact(block);
    Ok(match ty {
        GgmlType::F32 => chunks
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .position(|v| !v.is_finite()),
        GgmlType::F16 => chunks.map(f16_finite).position(|ok| !ok),
        // bf16: exponent bits 7..15 all ones.
        GgmlType::BF16 => chunks.position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80),
        _ => {
            let offsets = scale_offsets(ty).ok_or(ty)?;
            chunks.position(|b| offsets.iter().any(|&at| !f16_finite(&b[at..at + 2])))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::dequantize;

    /// The naive oracle: decode everything and look.
    fn decoded_first_non_finite(ty: GgmlType, bytes: &[u8]) -> Option<usize> {
        let (elems, block) = ty.block();
        let mut out = vec![0.0; bytes.len() / block * elems];
        dequantize(ty, bytes, &mut out).unwrap();
        out.iter().position(|v| !v.is_finite()).map(|i| i / elems)
    }

    #[test]
    fn a_non_finite_scale_is_found_in_the_block_the_decoder_says_for_every_decoded_type() {
        use GgmlType::*;
        let mut rng = crate::quant::Rng::new(7);
        for ty in [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
        ] {
            let (_, block) = ty.block();
            // Three blocks of small finite values.
            let mut bytes: Vec<u8> = (0..3 * block).map(|_| (rng.next_u64() % 8) as u8).collect();
            assert_eq!(first_non_finite(ty, &bytes), Ok(None), "{}", ty.name());
            assert_eq!(decoded_first_non_finite(ty, &bytes), None, "{}", ty.name());
            // An f16/bf16 infinity (0x7c00 / 0x7f80, little-endian) in the second block's first
            // float field.
            let at = block + scale_offsets(ty).map_or(0, |o| o[0]);
            let inf: [u8; 2] = if ty == BF16 {
                [0x80, 0x7f]
            } else {
                [0x00, 0x7c]
            };
            if ty == F32 {
                bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
            } else {
                bytes[at..at + 2].copy_from_slice(&inf);
            }
            assert_eq!(first_non_finite(ty, &bytes), Ok(Some(1)), "{}", ty.name());
            assert_eq!(
                decoded_first_non_finite(ty, &bytes),
                Some(1),
                "{}",
                ty.name()
            );
        }
    }

    #[test]
    fn a_type_of_unknown_layout_is_an_error() {
        assert_eq!(
            first_non_finite(GgmlType::Q2_K, &[0; 84]),
            Err(GgmlType::Q2_K)
        );
    }
}
