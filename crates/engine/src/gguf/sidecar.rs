//! The checksum sidecar of a GGUF file (`NAME.specfit-checksums.json` beside `NAME.gguf`). GGUF
//! carries no checksums, so the first use of a file makes them from its bytes as they are then —
//! which are trusted from there on, as the sidecar and the notice of its making say — after
//! checking that every tensor decodes to finite numbers: the CRC32C of each expert's gate, up
//! and down part separately, and of every other tensor whole. The sidecar is tied to the file's
//! length, modification time and header; a file that changed gets a new one. Later loads check
//! every non-expert tensor at once ([`verify_dense`]); the expert store checks each expert when
//! it is read. It reads and writes checksums; which experts are where is the store's business.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use specfit_gguf::{GgufFile, TensorInfo};

use crate::error::EngineError;
use crate::experts::SourceFile;

/// Where one expert stack's experts lie: its first byte in the file and the bytes of each.
#[derive(Debug, Clone, Copy)]
pub struct Stack {
    pub offset: u64,
    pub per_expert: u64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Sidecar {
    format: String,
    /// The GGUF file's length, modification time (ns since the Unix epoch) and the CRC32C of
    /// its header (everything before the data).
    gguf_bytes: u64,
    modified_ns: u64,
    header_crc32c: u32,
    /// What the checksums vouch for.
    trusted: String,
    moe_layers: usize,
    experts: usize,
    /// `[(moe layer · experts + expert) · 3 + part]`, parts gate, up, down.
    crc32c: Vec<u32>,
    /// Every other tensor's CRC32C, by GGUF name.
    tensors: BTreeMap<String, u32>,
}

const FORMAT: &str = "specfit-gguf-checksums/2";

const TRUSTED: &str = "the bytes of the file when specfit first used it, all of them finite";

/// Where the checksums of `gguf` are kept.
pub fn sidecar_path(gguf: &Path) -> PathBuf {
    gguf.with_extension("specfit-checksums.json")
}

/// A sidecar made just now, and why.
#[derive(Debug, Clone)]
pub struct Made {
    pub gguf: PathBuf,
    pub why: &'static str,
    pub tensors: usize,
    pub bytes: u64,
    pub seconds: f64,
}

impl std::fmt::Display for Made {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}, so specfit checksummed its {} tensors ({:.2} GB, {:.1} s) into {}; it trusts these bytes as they are now and checks later loads against them",
            self.gguf.display(),
            self.why,
            self.tensors,
            self.bytes as f64 / 1e9,
            self.seconds,
            sidecar_path(&self.gguf).display()
        )
    }
}

/// The experts' checksums, and whether they were made from these very bytes by this process
/// (so nothing is left to check against them).
#[derive(Debug)]
pub struct Checksums {
    pub experts: Vec<u32>,
    pub fresh: bool,
}

/// The files (path and identity) whose sidecar [`ensure`] made in this process and that no load
/// has used since: the load right after it need not check the bytes just checksummed again.
static MADE_HERE: std::sync::Mutex<Vec<(PathBuf, Identity)>> = std::sync::Mutex::new(Vec::new());

/// Whether [`ensure`] just made the sidecar of `file` as `id` says it is (forgotten once
/// asked).
fn take_made_here(file: &GgufFile, id: Identity) -> bool {
    let mut made = MADE_HERE.lock().unwrap_or_else(|e| e.into_inner());
    let before = made.len();
    made.retain(|(p, i)| !(p == file.path() && *i == id));
    made.len() < before
}

/// What a sidecar is tied to: the file's length, modification time (ns since the Unix epoch)
/// and header CRC32C.
type Identity = (u64, u64, u32);

/// The file's [`Identity`] now (length and time as the expert file's fingerprint reads them).
fn identity(file: &GgufFile) -> Result<Identity, EngineError> {
    let now = SourceFile::of(file.path())?;
    Ok((now.bytes, now.modified_ns, crc32c::crc32c(file.prefix())))
}

/// The sidecar at hand when it serves `file` (as `id` says it is now), else why not.
fn current(
    file: &GgufFile,
    id: Identity,
    stacks: &[[Stack; 3]],
    experts: usize,
) -> Result<Sidecar, &'static str> {
    let Ok(text) = std::fs::read_to_string(sidecar_path(file.path())) else {
        return Err("it had no checksums yet");
    };
    let Ok(s) = serde_json::from_str::<Sidecar>(&text) else {
        return Err("its checksums were of an older format");
    };
    if s.format != FORMAT {
        return Err("its checksums were of an older format");
    }
    if (s.gguf_bytes, s.modified_ns, s.header_crc32c) != id
        || s.moe_layers != stacks.len()
        || s.experts != experts
        || s.crc32c.len() != stacks.len() * experts * 3
    {
        return Err("the file changed since its checksums were made");
    }
    Ok(s)
}

/// The checksums of `file`'s experts (`stacks[moe layer]` = gate, up, down), from its sidecar
/// when that serves the file as it is now (every non-expert tensor then checked against it),
/// else made now and saved (atomically; a read-only folder only means they are made again next
/// time).
pub fn load_or_make(
    file: &GgufFile,
    stacks: &[[Stack; 3]],
    experts: usize,
) -> Result<Checksums, EngineError> {
    let id = identity(file)?;
    match current(file, id, stacks, experts) {
        Ok(s) if take_made_here(file, id) => Ok(Checksums {
            experts: s.crc32c,
            fresh: true,
        }),
        Ok(s) => {
            verify_dense(file, stacks, &s.tensors)?;
            Ok(Checksums {
                experts: s.crc32c,
                fresh: false,
            })
        }
        Err(why) => Ok(make(file, id, stacks, experts, why)?.0),
    }
}

/// Makes the sidecar when the one at hand does not serve `file` (None: it does; nothing read).
pub fn ensure(
    file: &GgufFile,
    stacks: &[[Stack; 3]],
    experts: usize,
) -> Result<Option<Made>, EngineError> {
    let id = identity(file)?;
    match current(file, id, stacks, experts) {
        Ok(_) => Ok(None),
        Err(why) => {
            let made = make(file, id, stacks, experts, why)?.1;
            let mut here = MADE_HERE.lock().unwrap_or_else(|e| e.into_inner());
            here.push((file.path().to_path_buf(), id));
            Ok(Some(made))
        }
    }
}

/// The tensors that are not expert stacks, with their bytes.
fn dense<'a>(
    file: &'a GgufFile,
    stacks: &[[Stack; 3]],
) -> impl Iterator<Item = (&'a TensorInfo, &'a [u8])> + 'a {
    let starts: std::collections::HashSet<u64> =
        stacks.iter().flatten().map(|s| s.offset).collect();
    file.header()
        .tensors
        .iter()
        .filter(move |t| !starts.contains(&file.absolute_offset(t)))
        .map(|t| (t, file.bytes(t)))
}

/// Refuses a tensor with a NaN or an infinity in it (types whose layout is not known are left
/// to the loader, which refuses them).
fn check_finite(
    file: &GgufFile,
    name: &str,
    t: &TensorInfo,
    bytes: &[u8],
) -> Result<(), EngineError> {
    match specfit_gguf::finite::first_non_finite(t.ty, bytes) {
        Ok(Some(at)) => Err(EngineError::NonFiniteTensor {
            path: file.path().to_path_buf(),
            tensor: name.to_string(),
            at,
        }),
        _ => Ok(()),
    }
}

/// Checks every tensor is finite, checksums it, and saves the sidecar.
fn make(
    file: &GgufFile,
    id: Identity,
    stacks: &[[Stack; 3]],
    experts: usize,
    why: &'static str,
) -> Result<(Checksums, Made), EngineError> {
    let start = Instant::now();
    let (gguf_bytes, modified_ns, header_crc32c) = id;
    let by_offset: HashMap<u64, &TensorInfo> = file
        .header()
        .tensors
        .iter()
        .map(|t| (file.absolute_offset(t), t))
        .collect();
    let mut crc = Vec::with_capacity(stacks.len() * experts * 3);
    let mut bytes = 0u64;
    for layer in stacks {
        for e in 0..experts as u64 {
            for stack in layer {
                let at = (stack.offset + e * stack.per_expert) as usize;
                let part = &file.raw()[at..at + stack.per_expert as usize];
                let info = by_offset[&stack.offset];
                check_finite(file, &format!("{} (expert {e})", info.name), info, part)?;
                crc.push(crc32c::crc32c(part));
                bytes += part.len() as u64;
            }
        }
    }
    let mut tensors = BTreeMap::new();
    for (t, data) in dense(file, stacks) {
        check_finite(file, &t.name, t, data)?;
        tensors.insert(t.name.clone(), crc32c::crc32c(data));
        bytes += data.len() as u64;
    }
    let sidecar = Sidecar {
        format: FORMAT.into(),
        gguf_bytes,
        modified_ns,
        header_crc32c,
        trusted: TRUSTED.into(),
        moe_layers: stacks.len(),
        experts,
        crc32c: crc,
        tensors,
    };
    let path = sidecar_path(file.path());
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string(&sidecar).expect("serialisable");
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let made = Made {
        gguf: file.path().to_path_buf(),
        why,
        tensors: sidecar.tensors.len() + stacks.len() * 3,
        bytes,
        seconds: start.elapsed().as_secs_f64(),
    };
    let sums = Checksums {
        experts: sidecar.crc32c,
        fresh: true,
    };
    Ok((sums, made))
}

/// Checks every non-expert tensor of `file` against `recorded`.
fn verify_dense(
    file: &GgufFile,
    stacks: &[[Stack; 3]],
    recorded: &BTreeMap<String, u32>,
) -> Result<(), EngineError> {
    for (t, data) in dense(file, stacks) {
        let got = crc32c::crc32c(data);
        let want = recorded.get(&t.name).copied();
        if want != Some(got) {
            return Err(EngineError::CorruptTensor {
                path: file.path().to_path_buf(),
                tensor: t.name.clone(),
                got,
                want: want.unwrap_or(0),
                sidecar: sidecar_path(file.path()),
            });
        }
    }
    Ok(())
}
