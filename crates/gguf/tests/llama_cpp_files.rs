//! Files written by llama.cpp's own converter and quantizer (fixtures/gguf, made by
//! tools/gguf/make_gguf_fixtures.py): every tensor of every file dequantizes to exactly the
//! bits of gguf-py's reference dequantization (sha256 of the f32 values).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use specfit_gguf::GgufFile;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gguf")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn every_tensor_of_llama_cpps_q8_0_q4_0_and_q4_k_m_files_dequantizes_to_gguf_pys_bits() {
    let mut types = std::collections::BTreeSet::new();
    for name in ["q8_0", "q4_0", "q4_k_m"] {
        let dir = fixtures();
        let reference: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("tiny-{name}.reference.json"))).unwrap(),
        )
        .unwrap();
        let file = GgufFile::open(&dir.join(format!("tiny-{name}.gguf"))).unwrap();
        let tensors = reference["tensors"].as_array().unwrap();
        assert_eq!(tensors.len(), file.header().tensors.len(), "{name}");
        for t in tensors {
            let tname = t["name"].as_str().unwrap();
            let info = file.header().tensor(tname).unwrap();
            assert_eq!(
                info.ty.name(),
                t["type"].as_str().unwrap(),
                "{name} {tname}"
            );
            let dims: Vec<u64> = t["dims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(info.dims, dims, "{name} {tname}");
            let values = file.dequantize(info).unwrap();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let head: Vec<f32> = t["head"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            assert_eq!(&values[..head.len()], &head[..], "{name} {tname}");
            assert_eq!(
                hex(&Sha256::digest(&bytes)),
                t["sha256"].as_str().unwrap(),
                "{name} {tname} ({})",
                info.ty.name()
            );
            types.insert(info.ty.name());
        }
    }
    let covered: Vec<&str> = types.into_iter().collect();
    assert_eq!(
        covered,
        ["F32", "Q4_0", "Q4_K", "Q5_0", "Q5_K", "Q6_K", "Q8_0"]
    );
}
