//! Routed experts straight from a GGUF file: expert `e` of a layer is one contiguous byte range
//! in each of the layer's `ffn_{gate,up,down}_exps` stacks. Streamed into slots, each range is
//! read through the page cache straight into the slot (with `SPECFIT_GGUF_DIRECT=1`: its 4
//! KiB-aligned cover with O_DIRECT into a bounce buffer, then copied) and checked against its
//! CRC32C, kept as stored (the quantized kernels run on GGUF blocks; decoded instead when a
//! storage dtype is forced): no conversion step and no second copy on disk. Or, when the experts
//! stay quantized and the tier is RAM, used in place ([`GgufStore::open_mapped`]): the kernels
//! read the memory-mapped file itself, as llama.cpp's mmap does, with no slots and no copies;
//! every expert is checked when the file is opened, unless its checksums were just computed from
//! those bytes (a corrupt one is checked again, and named, when a forward uses it). The
//! checksums come from the file's sidecar ([`super::sidecar`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use specfit_gguf::GgmlType;

use crate::error::EngineError;
use crate::experts::aligned::AlignedBuf;
use crate::experts::disk::ExpertFile;
use crate::experts::{ExpertLayout, ExpertMatrices, ExpertStore};
use crate::gguf::sidecar::{self, Made, Stack};
use crate::gguf::GgufTensors;
use crate::kernels::quant::QuantView;
use crate::kernels::{WeightBuf, WeightDtype};
use specfit_gguf::GgufFile;

/// One expert matrix of the file: MoE layer `layer`'s expert `expert`, `which` = 0 gate, 1 up,
/// 2 down.
#[derive(Debug, Clone, Copy)]
struct Matrix {
    layer: usize,
    expert: usize,
    which: usize,
}

/// O_DIRECT needs offsets, lengths and buffers aligned to the logical block size.
const ALIGN: u64 = 4096;

/// Where one expert's matrix lies: its stack's first byte in the file, bytes per expert, type.
#[derive(Debug, Clone, Copy)]
struct Part {
    offset: u64,
    per_expert: u64,
    ty: GgmlType,
}

impl Part {
    fn stack(self) -> Stack {
        Stack {
            offset: self.offset,
            per_expert: self.per_expert,
        }
    }
}

/// The sidecar of the GGUF file at `path` made now when the one beside it does not serve the
/// file as it is (None: it does, and nothing was read), for a caller that wants to say so before
/// loading.
pub fn ensure_checksums(path: &Path) -> Result<Option<Made>, EngineError> {
    let file = std::sync::Arc::new(super::open(path)?);
    let cfg = super::config_of(path, file.header())?;
    let tensors = GgufTensors::new(file);
    let (parts, experts) = expert_parts(&tensors, &cfg.moe_layers())?;
    let stacks: Vec<[Stack; 3]> = parts.iter().map(|l| l.map(Part::stack)).collect();
    sidecar::ensure(tensors.file(), &stacks, experts)
}

/// The experts of a GGUF file.
pub struct GgufStore {
    source: ExpertFile,
    layout: ExpertLayout,
    /// `[moe layer][gate, up, down]`.
    parts: Vec<[Part; 3]>,
    /// CRC32C of every part: `[(moe layer · experts + expert) · 3 + part]`.
    checksums: Vec<u32>,
    experts: usize,
    /// Used in place: the mapped file, and which experts (`moe layer · experts + expert`) have
    /// been checked against their checksums.
    mapped: Option<(Arc<GgufFile>, Vec<AtomicBool>)>,
}

impl std::fmt::Debug for GgufStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("GgufStore").field(&self.source).finish()
    }
}

impl GgufStore {
    /// The experts of `moe_layers` (decoder layer indices) in `tensors`' file, handed out in
    /// `layout` (whose dtype the decoded values are stored in).
    pub fn open(
        tensors: &GgufTensors,
        moe_layers: &[usize],
        layout: ExpertLayout,
    ) -> Result<GgufStore, EngineError> {
        GgufStore::open_with(tensors, moe_layers, layout, false)
    }

    /// The experts used where they rest in the mapped file ([`ExpertStore::in_place`]); `layout`
    /// must keep them quantized.
    pub fn open_mapped(
        tensors: &GgufTensors,
        moe_layers: &[usize],
        layout: ExpertLayout,
    ) -> Result<GgufStore, EngineError> {
        assert!(
            layout.quant_bytes.is_some(),
            "only quantized experts are used in place"
        );
        GgufStore::open_with(tensors, moe_layers, layout, true)
    }

    fn open_with(
        tensors: &GgufTensors,
        moe_layers: &[usize],
        layout: ExpertLayout,
        in_place: bool,
    ) -> Result<GgufStore, EngineError> {
        let path = tensors.path().to_path_buf();
        let (parts, experts) = expert_parts(tensors, moe_layers)?;
        let stacks: Vec<[Stack; 3]> = parts.iter().map(|l| l.map(Part::stack)).collect();
        let sums = sidecar::load_or_make(tensors.file(), &stacks, experts)?;
        let (checksums, computed_now) = (sums.experts, sums.fresh);
        let plain = File::open(&path).map_err(EngineError::io(&path))?;
        let mapped = in_place.then(|| {
            tensors.file().will_need();
            // Checksums computed just now came from these very bytes: nothing left to check.
            let checked = (0..parts.len() * experts)
                .map(|_| AtomicBool::new(computed_now))
                .collect();
            (Arc::clone(tensors.file()), checked)
        });
        let store = GgufStore {
            source: ExpertFile::open(&path, plain, !in_place && bypass_page_cache()),
            layout,
            parts,
            checksums,
            experts,
            mapped,
        };
        if !computed_now {
            store.check_mapped();
        }
        Ok(store)
    }

    /// Checks every mapped expert against its checksums now, on the worker pool, so that the
    /// first forwards do not pay for it (a corrupt expert stays unchecked: the forward that uses
    /// it checks it again and names it).
    fn check_mapped(&self) {
        let Some((_, checked)) = &self.mapped else {
            return;
        };
        let pool = crate::threads::pool();
        let parts = pool.threads();
        let total = checked.len();
        pool.run(&|part| {
            let range = total * part / parts..total * (part + 1) / parts;
            for (at, flag) in checked.iter().enumerate().take(range.end).skip(range.start) {
                let (layer, expert) = (at / self.experts, at % self.experts);
                let good = (0..3).all(|which| {
                    self.check(
                        Matrix {
                            layer,
                            expert,
                            which,
                        },
                        self.mapped_bytes(Matrix {
                            layer,
                            expert,
                            which,
                        }),
                    )
                    .is_ok()
                });
                flag.store(good, Ordering::Release);
            }
        });
    }

    /// Matrix `m`'s part (its type and stride) and its bytes' range in the file.
    fn span(&self, m: Matrix) -> (Part, std::ops::Range<u64>) {
        let part = self.parts[m.layer][m.which];
        let start = part.offset + m.expert as u64 * part.per_expert;
        (part, start..start + part.per_expert)
    }

    /// The mapped bytes of matrix `m`.
    fn mapped_bytes(&self, m: Matrix) -> &[u8] {
        let (file, _) = self.mapped.as_ref().expect("a mapped store");
        let (_, range) = self.span(m);
        &file.raw()[range.start as usize..range.end as usize]
    }

    /// The `elements` values of matrix `m`, read, checked and decoded.
    fn read_part(&self, m: Matrix, elements: usize) -> Result<Vec<f32>, EngineError> {
        let raw = self.read_raw(m)?;
        let mut out = vec![0.0f32; elements];
        specfit_gguf::dequant::dequantize(self.span(m).0.ty, raw.bytes(), &mut out)
            .expect("type checked at open");
        Ok(out)
    }

    /// The GGUF bytes of matrix `m`, read and checked.
    fn read_raw(&self, m: Matrix) -> Result<Raw, EngineError> {
        let (_, std::ops::Range { start, end }) = self.span(m);
        let (lo, hi) = (start / ALIGN * ALIGN, end.div_ceil(ALIGN) * ALIGN);
        let mut buf = AlignedBuf::zeroed((hi - lo) as usize);
        let got = read_at_most(&self.source.file, buf.as_mut_slice(), lo).map_err(|e| {
            EngineError::ExpertStore {
                reason: format!(
                    "{}: reading bytes {start}..{end}: {e}",
                    self.source.path.display()
                ),
            }
        })?;
        if (got as u64) < end - lo {
            return Err(EngineError::ExpertStore {
                reason: format!(
                    "{}: truncated: bytes {start}..{end} run past the end of the file",
                    self.source.path.display()
                ),
            });
        }
        let raw = Raw {
            buf,
            range: (start - lo) as usize..(end - lo) as usize,
        };
        self.check(m, raw.bytes())?;
        Ok(raw)
    }

    /// Reads file bytes `start..end` into `buf` (as long), through the page cache.
    fn read_exact(&self, start: u64, end: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        let got =
            read_at_most(&self.source.file, buf, start).map_err(|e| EngineError::ExpertStore {
                reason: format!(
                    "{}: reading bytes {start}..{end}: {e}",
                    self.source.path.display()
                ),
            })?;
        if got < buf.len() {
            return Err(EngineError::ExpertStore {
                reason: format!(
                    "{}: truncated: bytes {start}..{end} run past the end of the file",
                    self.source.path.display()
                ),
            });
        }
        Ok(())
    }

    /// Checks `bytes`, MoE layer `layer`'s expert `expert`'s matrix `which`, against its CRC32C.
    fn check(&self, m: Matrix, bytes: &[u8]) -> Result<(), EngineError> {
        let Matrix {
            layer,
            expert,
            which,
        } = m;
        let want = self.checksums[(layer * self.experts + expert) * 3 + which];
        let got = crc32c::crc32c(bytes);
        if got != want {
            return Err(EngineError::ExpertStore {
                reason: format!(
                    "{}: MoE layer {layer} expert {expert} ({}) is corrupt (CRC32C {got:08x}, {} recorded {want:08x})",
                    self.source.path.display(),
                    ["gate", "up", "down"][which],
                    sidecar::sidecar_path(&self.source.path).display()
                ),
            });
        }
        Ok(())
    }
}

/// The bytes of one read: the aligned cover and where the wanted range lies in it.
struct Raw {
    buf: AlignedBuf,
    range: std::ops::Range<usize>,
}

impl Raw {
    fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[self.range.clone()]
    }
}

/// Where each MoE layer's gate, up and down expert stacks lie (`moe_layers`: decoder layer
/// indices), and the experts per stack.
fn expert_parts(
    tensors: &GgufTensors,
    moe_layers: &[usize],
) -> Result<(Vec<[Part; 3]>, usize), EngineError> {
    let path = tensors.path().to_path_buf();
    let mut parts = Vec::with_capacity(moe_layers.len());
    let mut experts = 0;
    for &layer in moe_layers {
        let mut part = |proj: &str| -> Result<Part, EngineError> {
            let info =
                tensors
                    .expert_stack(layer, proj)
                    .ok_or_else(|| EngineError::MissingTensor {
                        name: format!("model.layers.{layer}.mlp.experts.0.{proj}_proj.weight"),
                        searched: path.display().to_string(),
                    })?;
            if !specfit_gguf::dequant::supports(info.ty) {
                return Err(EngineError::Gguf {
                    path: path.clone(),
                    error: specfit_gguf::GgufError::UnsupportedType {
                        name: info.name.clone(),
                        ty: info.ty.name(),
                        supported: specfit_gguf::dequant::SUPPORTED,
                    },
                });
            }
            experts = info.dims[2] as usize;
            Ok(Part {
                offset: tensors.file().absolute_offset(info),
                per_expert: info.size / info.dims[2],
                ty: info.ty,
            })
        };
        parts.push([part("gate")?, part("up")?, part("down")?]);
    }
    Ok((parts, experts))
}

/// Whether expert reads should bypass the page cache: no unless `SPECFIT_GGUF_DIRECT=1`. Reads
/// of exact expert ranges through the page cache make it a second cache level behind the slots,
/// even for a file larger than RAM (measured on a 32.5 GB file with 23.5 GiB of RAM, 8–64 slots:
/// 1.17–1.35× the O_DIRECT decode rate; BENCHMARKS.md, "Full size"), and unlike a mapping they
/// never fault in pages around what is needed.
fn bypass_page_cache() -> bool {
    std::env::var("SPECFIT_GGUF_DIRECT").as_deref() == Ok("1")
}

/// Reads into `buf` from `offset` until it is full or the file ends; returns the bytes read.
fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl ExpertStore for GgufStore {
    fn layout(&self) -> ExpertLayout {
        self.layout
    }

    fn read_into(&self, layer: usize, expert: usize, dst: &mut [u8]) -> Result<(), EngineError> {
        let (h, i) = (self.layout.hidden, self.layout.intermediate);
        if self.layout.quant_bytes.is_some() && !self.source.direct {
            // Kept quantized, read through the page cache straight into the slot.
            let types = [0, 1, 2].map(|w| self.parts[layer][w].ty);
            let dst = &mut dst[..self.layout.bytes()];
            self.layout.write_quant_header(types, dst);
            for (which, (at, len)) in self.layout.quant_parts(types).into_iter().enumerate() {
                let part = self.parts[layer][which];
                let start = part.offset + expert as u64 * part.per_expert;
                self.read_exact(start, start + part.per_expert, &mut dst[at..at + len])?;
                self.check(
                    Matrix {
                        layer,
                        expert,
                        which,
                    },
                    &dst[at..at + len],
                )?;
            }
            return Ok(());
        }
        if self.layout.quant_bytes.is_some() {
            // Kept quantized: the GGUF rows as stored, no decoding.
            let raw = [0, 1, 2].map(|w| {
                self.read_raw(Matrix {
                    layer,
                    expert,
                    which: w,
                })
            });
            let [gate, up, down] = raw;
            let (gate, up, down) = (gate?, up?, down?);
            let ty = |w: usize| self.parts[layer][w].ty;
            self.layout.write_quant_block(
                [
                    (ty(0), gate.bytes()),
                    (ty(1), up.bytes()),
                    (ty(2), down.bytes()),
                ],
                &mut dst[..self.layout.bytes()],
            );
            return Ok(());
        }
        let gate = self.read_part(
            Matrix {
                layer,
                expert,
                which: 0,
            },
            i * h,
        )?;
        let up = self.read_part(
            Matrix {
                layer,
                expert,
                which: 1,
            },
            i * h,
        )?;
        let down = self.read_part(
            Matrix {
                layer,
                expert,
                which: 2,
            },
            h * i,
        )?;
        let store = |v: Vec<f32>| match self.layout.dtype {
            WeightDtype::F32 => WeightBuf::F32(v),
            WeightDtype::Bf16 => WeightBuf::Bf16(
                v.iter()
                    .map(|&x| half::bf16::from_f32(x).to_bits())
                    .collect(),
            ),
        };
        let (gate, up, down) = (store(gate), store(up), store(down));
        let block = self.layout.block_bytes(gate.view(), up.view(), down.view());
        dst[..block.len()].copy_from_slice(&block);
        Ok(())
    }

    fn maps_in_place(&self) -> bool {
        self.mapped.is_some()
    }

    fn in_place(&self, layer: usize, expert: usize) -> Result<ExpertMatrices<'_>, EngineError> {
        let Some((_, checked)) = &self.mapped else {
            return Err(EngineError::ExpertStore {
                reason: format!(
                    "{}: experts are read into slots",
                    self.source.path.display()
                ),
            });
        };
        let (h, i) = (self.layout.hidden, self.layout.intermediate);
        let bytes = |which: usize| {
            self.mapped_bytes(Matrix {
                layer,
                expert,
                which,
            })
        };
        let once = &checked[layer * self.experts + expert];
        if !once.load(Ordering::Acquire) {
            for which in 0..3 {
                self.check(
                    Matrix {
                        layer,
                        expert,
                        which,
                    },
                    bytes(which),
                )?;
            }
            once.store(true, Ordering::Release);
        }
        let view = |which: usize, n: usize, k: usize| {
            QuantView::new(self.parts[layer][which].ty, n, k, bytes(which))
        };
        Ok(ExpertMatrices::Quant {
            gate: view(0, i, h),
            up: view(1, i, h),
            down: view(2, h, i),
        })
    }

    fn tier(&self) -> &'static str {
        if self.mapped.is_some() {
            "ram (GGUF mapped in place)"
        } else if self.source.direct {
            "disk (GGUF, O_DIRECT)"
        } else {
            "disk (GGUF, page cache)"
        }
    }
}
