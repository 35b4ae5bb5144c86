//! Expert sets as flat bitsets and the popcount kernels the search runs on.
//!
//! A token's routes over all `L` MoE layers of `E` experts each are one bitset of `L·E` bits
//! (bit `l·E + e` = "layer `l` routes to expert `e`"), stored as `W = ⌈L·E/64⌉` words. Because
//! layers occupy disjoint bit ranges, `Σ_l |U_l|` is a single popcount over the flat union. This
//! module owns that layout and the kernels; it knows nothing of trees, costs or objectives.
//!
//! The kernels are compiled three times (AVX-512 VPOPCNTDQ, POPCNT, portable) and picked once at
//! run time by [`Kernels::detect`].

use crate::error::{Error, Owner};

/// Largest number of experts per layer a pool may have (Kimi-K2 has 384).
pub const MAX_EXPERTS: usize = 512;

/// The most MoE layers a pool or resident set may span (the largest MoE models have ~100).
pub const MAX_LAYERS: usize = 1024;

/// Refuses a `layers × experts` shape outside 1..=[`MAX_LAYERS`] × 1..=[`MAX_EXPERTS`], before
/// anything of that size is allocated.
pub fn check_shape(layers: usize, experts: usize) -> Result<(), Error> {
    if layers == 0 || layers > MAX_LAYERS {
        return Err(Error::LayersOutOfRange {
            layers,
            max: MAX_LAYERS,
        });
    }
    if experts == 0 || experts > MAX_EXPERTS {
        return Err(Error::ExpertsOutOfRange {
            experts,
            max: MAX_EXPERTS,
        });
    }
    Ok(())
}

/// Words of a flat bitset over `layers × experts` bits.
pub fn words_for(layers: usize, experts: usize) -> usize {
    (layers * experts).div_ceil(64)
}

/// Writes per-layer expert id lists into a zeroed flat bitset, validating every id.
pub(crate) fn fill_routes<R: AsRef<[u32]>>(
    dst: &mut [u64],
    owner: Owner,
    layers: usize,
    experts: usize,
    routes: &[R],
) -> Result<(), Error> {
    if routes.len() != layers {
        return Err(Error::LayerCountMismatch {
            owner,
            got: routes.len(),
            expected: layers,
        });
    }
    for (layer, ids) in routes.iter().enumerate() {
        for &expert in ids.as_ref() {
            if expert as usize >= experts {
                return Err(Error::ExpertOutOfRange {
                    owner,
                    layer,
                    expert: expert as u64,
                    experts,
                });
            }
            let bit = layer * experts + expert as usize;
            let (word, mask) = (bit / 64, 1u64 << (bit % 64));
            if dst[word] & mask != 0 {
                return Err(Error::DuplicateExpert {
                    owner,
                    layer,
                    expert,
                });
            }
            dst[word] |= mask;
        }
    }
    Ok(())
}

/// Number of set bits.
pub fn count(a: &[u64]) -> u32 {
    a.iter().map(|w| w.count_ones()).sum()
}

/// The experts per layer of a flat bitset, as sorted id lists (the inverse of `fill_routes`).
pub fn to_routes(a: &[u64], layers: usize, experts: usize) -> Vec<Vec<u32>> {
    (0..layers)
        .map(|l| {
            (0..experts as u32)
                .filter(|&e| {
                    let bit = l * experts + e as usize;
                    a[bit / 64] >> (bit % 64) & 1 == 1
                })
                .collect()
        })
        .collect()
}

/// Marginal demand of a node: `|m \ u|`, and, when `out` is given, `out = u ∪ m`.
type MarginalFn = unsafe fn(m: &[u64], u: &[u64], out: Option<&mut [u64]>) -> u32;
/// Residency-split marginal: `(|(m \ u) ∩ r|, |(m \ u) \ r|)`, and `out = u ∪ m` when given.
type MarginalResFn =
    unsafe fn(m: &[u64], u: &[u64], r: &[u64], out: Option<&mut [u64]>) -> (u32, u32);

/// The kernel set chosen for this CPU.
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    marginal: MarginalFn,
    marginal_res: MarginalResFn,
    pub(crate) name: &'static str,
}

macro_rules! kernel_bodies {
    ($marg:ident, $marg_res:ident, $($feat:literal)?) => {
        $(#[target_feature(enable = $feat)])?
        unsafe fn $marg(m: &[u64], u: &[u64], out: Option<&mut [u64]>) -> u32 {
            debug_assert_eq!(m.len(), u.len());
            let n = m.len().min(u.len());
            let (m, u) = (&m[..n], &u[..n]);
            let mut total = 0u32;
            match out {
                Some(out) => {
                    let out = &mut out[..n];
                    for i in 0..n {
                        total += (m[i] & !u[i]).count_ones();
                        out[i] = m[i] | u[i];
                    }
                }
                None => {
                    for i in 0..n {
                        total += (m[i] & !u[i]).count_ones();
                    }
                }
            }
            total
        }

        $(#[target_feature(enable = $feat)])?
        unsafe fn $marg_res(m: &[u64], u: &[u64], r: &[u64], out: Option<&mut [u64]>) -> (u32, u32) {
            debug_assert!(m.len() == u.len() && u.len() == r.len());
            let n = m.len().min(u.len()).min(r.len());
            let (m, u, r) = (&m[..n], &u[..n], &r[..n]);
            let (mut hits, mut misses) = (0u32, 0u32);
            for i in 0..n {
                let new = m[i] & !u[i];
                hits += (new & r[i]).count_ones();
                misses += (new & !r[i]).count_ones();
            }
            if let Some(out) = out {
                for (o, (a, b)) in out[..n].iter_mut().zip(m.iter().zip(u)) {
                    *o = a | b;
                }
            }
            (hits, misses)
        }
    };
}

kernel_bodies!(marginal_portable, marginal_res_portable,);
#[cfg(target_arch = "x86_64")]
kernel_bodies!(marginal_popcnt, marginal_res_popcnt, "popcnt");
#[cfg(target_arch = "x86_64")]
kernel_bodies!(
    marginal_avx512,
    marginal_res_avx512,
    "avx512f,avx512vpopcntdq,popcnt"
);

impl Kernels {
    /// The fastest kernel set this CPU supports.
    pub(crate) fn detect() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512vpopcntdq")
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                return Kernels {
                    marginal: marginal_avx512,
                    marginal_res: marginal_res_avx512,
                    name: "avx512-vpopcntdq",
                };
            }
            if std::arch::is_x86_feature_detected!("popcnt") {
                return Kernels {
                    marginal: marginal_popcnt,
                    marginal_res: marginal_res_popcnt,
                    name: "popcnt",
                };
            }
        }
        Kernels::portable()
    }

    /// The kernel set without CPU-specific instructions (used by tests to cross-check).
    pub(crate) fn portable() -> Kernels {
        Kernels {
            marginal: marginal_portable,
            marginal_res: marginal_res_portable,
            name: "portable",
        }
    }

    /// `|m \ u|`, writing `u ∪ m` into `out` when given.
    #[inline]
    pub(crate) fn marginal(&self, m: &[u64], u: &[u64], out: Option<&mut [u64]>) -> u32 {
        // SAFETY: `detect` only selects a target-feature variant after confirming the CPU
        // supports those features; the portable variant has no requirements.
        unsafe { (self.marginal)(m, u, out) }
    }

    /// `(|(m \ u) ∩ r|, |(m \ u) \ r|)`, writing `u ∪ m` into `out` when given.
    #[inline]
    pub(crate) fn marginal_res(
        &self,
        m: &[u64],
        u: &[u64],
        r: &[u64],
        out: Option<&mut [u64]>,
    ) -> (u32, u32) {
        // SAFETY: as in `marginal`.
        unsafe { (self.marginal_res)(m, u, r, out) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed
    }

    #[test]
    fn every_kernel_variant_agrees_with_naive_set_arithmetic() {
        let mut seed = 7;
        for len in [0usize, 1, 3, 8, 17, 96] {
            let m: Vec<u64> = (0..len).map(|_| lcg(&mut seed)).collect();
            let u: Vec<u64> = (0..len).map(|_| lcg(&mut seed) & lcg(&mut seed)).collect();
            let r: Vec<u64> = (0..len).map(|_| lcg(&mut seed)).collect();
            let want: u32 = m.iter().zip(&u).map(|(a, b)| (a & !b).count_ones()).sum();
            let want_hits: u32 = (0..len).map(|i| (m[i] & !u[i] & r[i]).count_ones()).sum();
            let want_union: Vec<u64> = m.iter().zip(&u).map(|(a, b)| a | b).collect();
            for k in [Kernels::portable(), Kernels::detect()] {
                let mut out = vec![0; len];
                assert_eq!(k.marginal(&m, &u, Some(&mut out)), want, "{}", k.name);
                assert_eq!(out, want_union);
                assert_eq!(k.marginal(&m, &u, None), want);
                let mut out = vec![0; len];
                let (h, x) = k.marginal_res(&m, &u, &r, Some(&mut out));
                assert_eq!((h, h + x), (want_hits, want), "{}", k.name);
                assert_eq!(out, want_union);
            }
        }
    }

    #[test]
    fn routes_round_trip_through_the_flat_layout() {
        let routes = vec![vec![0u32, 5, 63], vec![], vec![64, 99]];
        let mut bits = vec![0; words_for(3, 100)];
        fill_routes(&mut bits, Owner::Root, 3, 100, &routes).unwrap();
        assert_eq!(count(&bits), 5);
        assert_eq!(to_routes(&bits, 3, 100), routes);
    }

    #[test]
    fn bad_routes_name_the_owner_layer_and_value() {
        let mut bits = vec![0; words_for(2, 8)];
        let err = fill_routes(&mut bits, Owner::Node(3), 2, 8, &[vec![1u32], vec![8]]);
        assert_eq!(
            err.unwrap_err().to_string(),
            "nodes[3].routes[1] holds expert 8, but experts = 8 (ids are 0..8)"
        );
        let mut bits = vec![0; words_for(2, 8)];
        let err = fill_routes(&mut bits, Owner::Root, 2, 8, &[vec![1u32, 1], vec![]]);
        assert_eq!(
            err.unwrap_err().to_string(),
            "root.routes[0] lists expert 1 twice"
        );
        let err = fill_routes(&mut bits, Owner::Resident, 2, 8, &[vec![1u32]]);
        assert_eq!(
            err.unwrap_err().to_string(),
            "resident has 1 layers, expected layers = 2"
        );
    }
}
