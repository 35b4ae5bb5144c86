//! The reader against the writer, and against every kind of broken file: truncations at every
//! byte, corrupted fields, and thousands of random and mutated files (never a panic).

use specfit_gguf::write::{to_bytes, TensorSpec};
use specfit_gguf::{GgmlType, Gguf, GgufError, Value, ValueType};

/// Metadata, tensor directory and each tensor's bytes.
type Sample = (Vec<(String, Value)>, Vec<TensorSpec>, Vec<Vec<u8>>);
/// Changes a directory entry's bytes, given where the entry starts.
type Edit = Box<dyn Fn(&mut Vec<u8>, usize)>;

fn sample() -> Sample {
    let metadata = vec![
        (
            "general.architecture".to_string(),
            Value::String("qwen3moe".into()),
        ),
        ("qwen3moe.block_count".to_string(), Value::U32(2)),
        ("qwen3moe.rope.freq_base".to_string(), Value::F32(1e6)),
        ("flag".to_string(), Value::Bool(true)),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array {
                item: ValueType::String,
                values: vec![Value::String("a".into()), Value::String("ü".into())],
            },
        ),
        (
            "nested".to_string(),
            Value::Array {
                item: ValueType::Array,
                values: vec![Value::Array {
                    item: ValueType::I64,
                    values: vec![Value::I64(-3)],
                }],
            },
        ),
    ];
    let tensors = vec![
        TensorSpec {
            name: "a".into(),
            dims: vec![3, 2],
            ty: GgmlType::F32,
        },
        TensorSpec {
            name: "b".into(),
            dims: vec![64, 2, 3],
            ty: GgmlType::Q8_0,
        },
    ];
    let data = vec![
        (0..24).map(|i| i as u8).collect(),
        (0..2 * 3 * 68).map(|i| (i * 7) as u8).collect(),
    ];
    (metadata, tensors, data)
}

#[test]
fn a_written_file_reads_back_with_its_metadata_tensors_and_bytes() {
    let (metadata, tensors, data) = sample();
    let bytes = to_bytes(&metadata, &tensors, &data).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.metadata, metadata);
    assert_eq!(
        g.get("qwen3moe.block_count").and_then(Value::as_u64),
        Some(2)
    );
    assert_eq!(g.alignment, 32);
    assert_eq!(g.data_offset % 32, 0);
    for (spec, want) in tensors.iter().zip(&data) {
        let t = g.tensor(&spec.name).unwrap();
        assert_eq!((&t.dims, t.ty), (&spec.dims, spec.ty));
        assert_eq!(t.offset % 32, 0);
        let at = (g.data_offset + t.offset) as usize;
        assert_eq!(&bytes[at..at + t.size as usize], &want[..]);
    }
}

#[test]
fn a_custom_alignment_is_honoured() {
    let (mut metadata, tensors, data) = sample();
    metadata.push(("general.alignment".into(), Value::U32(64)));
    let bytes = to_bytes(&metadata, &tensors, &data).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.alignment, 64);
    assert!(g.tensors.iter().all(|t| t.offset % 64 == 0));
    metadata.last_mut().unwrap().1 = Value::U32(48);
    let bytes = to_bytes(&metadata, &tensors, &data).unwrap();
    let err = Gguf::parse(&bytes).unwrap_err();
    assert!(err.to_string().contains("power of two"), "{err}");
}

#[test]
fn every_truncation_is_an_error_naming_what_is_missing() {
    let (metadata, tensors, data) = sample();
    let bytes = to_bytes(&metadata, &tensors, &data).unwrap();
    // The last tensor's padding is not data: cutting it off leaves a valid file.
    let end = {
        let g = Gguf::parse(&bytes).unwrap();
        let t = g.tensors.last().unwrap();
        (g.data_offset + t.offset + t.size) as usize
    };
    for len in 0..end {
        match Gguf::parse(&bytes[..len]) {
            Err(GgufError::Truncated { .. }) | Err(GgufError::TooLarge { .. }) => {}
            other => panic!("cut at {len}: {other:?}"),
        }
    }
    assert!(Gguf::parse(&bytes[..end]).is_ok());
}

/// The sample with tensor `b`'s directory entry changed by `edit` (the entry's bytes: name,
/// rank, dims, type, offset).
fn with_entry(edit: impl Fn(&mut Vec<u8>, usize)) -> Result<Gguf, GgufError> {
    let (metadata, tensors, data) = sample();
    let mut bytes = to_bytes(&metadata, &tensors, &data).unwrap();
    let name_at = bytes
        .windows(9)
        .position(|w| w == [1, 0, 0, 0, 0, 0, 0, 0, b'b'])
        .unwrap();
    edit(&mut bytes, name_at + 9);
    Gguf::parse(&bytes)
}

#[test]
fn broken_tensor_entries_are_refused_with_the_tensors_name() {
    // Entry of b after its name: rank u32 @0, dims 3 × u64 @4, type u32 @28, offset u64 @32.
    let cases: Vec<(&str, Edit)> = vec![
        (
            "rank 0",
            Box::new(|b, at| b[at..at + 4].copy_from_slice(&0u32.to_le_bytes())),
        ),
        (
            "zero dimension",
            Box::new(|b, at| b[at + 4..at + 12].copy_from_slice(&0u64.to_le_bytes())),
        ),
        (
            "not whole blocks",
            Box::new(|b, at| b[at + 4..at + 12].copy_from_slice(&40u64.to_le_bytes())),
        ),
        (
            "unknown type",
            Box::new(|b, at| b[at + 28..at + 32].copy_from_slice(&99u32.to_le_bytes())),
        ),
        (
            "misaligned",
            Box::new(|b, at| b[at + 32..at + 40].copy_from_slice(&33u64.to_le_bytes())),
        ),
        (
            "overlapping",
            Box::new(|b, at| b[at + 32..at + 40].copy_from_slice(&0u64.to_le_bytes())),
        ),
        (
            "beyond the file",
            Box::new(|b, at| b[at + 32..at + 40].copy_from_slice(&(1u64 << 40).to_le_bytes())),
        ),
        (
            "huge shape",
            Box::new(|b, at| b[at + 12..at + 20].copy_from_slice(&(1u64 << 62).to_le_bytes())),
        ),
    ];
    for (what, edit) in cases {
        let err = with_entry(edit).expect_err(what);
        let text = err.to_string();
        assert!(
            text.contains("\"b\"") || text.contains("\"a\""),
            "{what}: {text}"
        );
    }
}

#[test]
fn wrong_magic_version_and_duplicate_keys_are_refused() {
    let (metadata, tensors, data) = sample();
    let bytes = to_bytes(&metadata, &tensors, &data).unwrap();
    let mut b = bytes.clone();
    b[0] = b'X';
    assert!(matches!(Gguf::parse(&b), Err(GgufError::BadMagic { .. })));
    let mut b = bytes.clone();
    b[4] = 9;
    assert!(matches!(
        Gguf::parse(&b),
        Err(GgufError::Version { version: 9 })
    ));
    let mut twice = metadata.clone();
    twice.push(metadata[1].clone());
    let b = to_bytes(&twice, &tensors, &data).unwrap();
    assert!(matches!(
        Gguf::parse(&b),
        Err(GgufError::DuplicateKey { .. })
    ));
}

/// xorshift64*: a seeded stream for the fuzz loops.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn random_and_mutated_files_never_panic() {
    let (metadata, tensors, data) = sample();
    let valid = to_bytes(&metadata, &tensors, &data).unwrap();
    let mut rng = Rng(0x5eed);
    for _ in 0..3000 {
        let len = rng.below(400);
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if len >= 8 && rng.below(2) == 0 {
            b[..8].copy_from_slice(&valid[..8]);
        }
        let _ = Gguf::parse(&b);
    }
    for _ in 0..3000 {
        let mut b = valid.clone();
        for _ in 0..1 + rng.below(4) {
            if b.is_empty() {
                break;
            }
            let at = rng.below(b.len());
            match rng.below(3) {
                0 => b[at] = rng.next() as u8,
                1 => b[at] ^= 1 << rng.below(8),
                _ => b.truncate(at),
            }
        }
        if let Ok(g) = Gguf::parse(&b) {
            // Whatever parses must describe data inside the bytes.
            for t in &g.tensors {
                assert!(g.data_offset + t.offset + t.size <= b.len() as u64);
            }
        }
    }
}
