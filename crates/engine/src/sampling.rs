//! Choosing the next token from logits: greedy (argmax, lowest id on ties) or temperature +
//! nucleus (top-p) sampling with a seeded generator, so that runs are reproducible. It does not
//! know about models; speculative verification uses the same distribution ([`Sampler::probs`]).

use specfit_selector::synth::Rng;

/// How tokens are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Sampling {
    #[default]
    Greedy,
    /// Softmax of `logits / temperature`, restricted to the smallest set of most probable
    /// tokens whose mass reaches `top_p`, renormalised.
    TopP { temperature: f32, top_p: f32 },
}

impl Sampling {
    /// The sampling `temperature` and `top_p` describe, as OpenAI's API and `specfit generate` take
    /// them: greedy at temperature 0, else top-p sampling.
    pub fn from_temperature(temperature: f32, top_p: f32) -> Sampling {
        if temperature == 0.0 {
            Sampling::Greedy
        } else {
            Sampling::TopP { temperature, top_p }
        }
    }
}

/// How tokens are drawn ([`Sampling`]) with its random stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    pub sampling: Sampling,
    rng: Rng,
}

impl Sampler {
    pub fn new(sampling: Sampling, seed: u64) -> Sampler {
        Sampler {
            sampling,
            rng: Rng::new(seed),
        }
    }

    /// The distribution `sampling` draws from, as `(token, probability)` with probability > 0,
    /// most probable first (ties by lower id). Greedy is a point mass on the argmax.
    pub fn probs(sampling: Sampling, logits: &[f32]) -> Vec<(u32, f64)> {
        match sampling {
            Sampling::Greedy => vec![(argmax(logits), 1.0)],
            Sampling::TopP { temperature, top_p } => {
                let t = temperature as f64;
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let mut p: Vec<(u32, f64)> = logits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, ((l as f64 - max) / t).exp()))
                    .collect();
                let z: f64 = p.iter().map(|x| x.1).sum();
                p.iter_mut().for_each(|x| x.1 /= z);
                p.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let mut mass = 0.0;
                let mut keep = p.len();
                for (i, x) in p.iter().enumerate() {
                    mass += x.1;
                    if mass >= top_p as f64 {
                        keep = i + 1;
                        break;
                    }
                }
                p.truncate(keep);
                let z: f64 = p.iter().map(|x| x.1).sum();
                p.iter_mut().for_each(|x| x.1 /= z);
                p
            }
        }
    }

    /// Draws one token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.sampling == Sampling::Greedy {
            return argmax(logits);
        }
        let probs = Sampler::probs(self.sampling, logits);
        self.draw(&probs)
    }

    /// Draws from an explicit distribution (inverse CDF).
    pub fn draw(&mut self, probs: &[(u32, f64)]) -> u32 {
        let u = self.rng.unit();
        let mut acc = 0.0;
        for &(tok, p) in probs {
            acc += p;
            if u < acc {
                return tok;
            }
        }
        probs.last().map_or(0, |x| x.0)
    }
}

/// Index of the largest logit, lowest index on ties.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_zero_is_greedy_and_any_other_samples_top_p() {
        assert_eq!(Sampling::from_temperature(0.0, 0.5), Sampling::Greedy);
        assert_eq!(
            Sampling::from_temperature(0.7, 0.9),
            Sampling::TopP {
                temperature: 0.7,
                top_p: 0.9
            }
        );
    }

    #[test]
    fn top_p_keeps_the_smallest_head_reaching_the_mass() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let all = Sampler::probs(
            Sampling::TopP {
                temperature: 1.0,
                top_p: 1.0,
            },
            &logits,
        );
        assert_eq!(all.len(), 4);
        let head = Sampler::probs(
            Sampling::TopP {
                temperature: 1.0,
                top_p: 0.7,
            },
            &logits,
        );
        assert_eq!(head.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!((head.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn sampling_frequencies_follow_the_distribution() {
        let logits = [1.0f32, 0.5, 0.0, -2.0];
        let sampling = Sampling::TopP {
            temperature: 0.8,
            top_p: 1.0,
        };
        let want = Sampler::probs(sampling, &logits);
        let mut s = Sampler::new(sampling, 7);
        let n = 200_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&logits) as usize] += 1;
        }
        // Pearson chi-square with 3 degrees of freedom; 16.27 is the 0.1% critical value.
        let chi2: f64 = want
            .iter()
            .map(|&(tok, p)| {
                let e = p * n as f64;
                (counts[tok as usize] as f64 - e).powi(2) / e
            })
            .sum();
        assert!(
            chi2 < 16.27,
            "chi2 = {chi2}, counts {counts:?}, want {want:?}"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens() {
        let logits = [0.3f32, 0.2, 0.1];
        let sampling = Sampling::TopP {
            temperature: 1.0,
            top_p: 0.9,
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(sampling, 3);
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(sampling, 3);
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
    }
}
