//! A deterministic R-MAT generator (Chakrabarti, Zhan & Faloutsos, SDM 2004).
//! Pure function of its parameters; nothing shared.
//!
//! Each edge picks one quadrant of the adjacency matrix per bit of the vertex
//! id, `scale` times: top-left with probability `a`, top-right `b`,
//! bottom-left `c`, bottom-right `d = 1 - a - b - c`. Skewed probabilities
//! give the power-law degrees of real graphs. The defaults are Graph500's
//! (a, b, c, d) = (0.57, 0.19, 0.19, 0.05). The output keeps duplicates and
//! self-loops, as R-MAT produces them; the dynamic graph ignores duplicates.

use super::EdgeList;

/// R-MAT parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rmat {
    /// log2 of the vertex count.
    pub scale: u32,
    /// Edges per vertex: `edge_factor << scale` edges in all.
    pub edge_factor: u32,
    /// Probability of the top-left quadrant.
    pub a: f64,
    /// Probability of the top-right quadrant.
    pub b: f64,
    /// Probability of the bottom-left quadrant (bottom-right: `1 - a - b - c`).
    pub c: f64,
    /// Seed of the generator.
    pub seed: u64,
}

/// Graph500's quadrant probabilities (a, b, c); d = 0.05.
pub const GRAPH500_ABC: (f64, f64, f64) = (0.57, 0.19, 0.19);

/// The largest scale: vertex ids are 32-bit.
pub const MAX_SCALE: u32 = 31;

/// The seeded generator of R-MAT streams and of the graph tests' and
/// benchmark's update picks.
pub use gpu_kernel::workload::SplitMix64;

impl Rmat {
    /// Graph500 probabilities with the given size and seed.
    pub fn new(scale: u32, edge_factor: u32, seed: u64) -> Rmat {
        let (a, b, c) = GRAPH500_ABC;
        Rmat {
            scale,
            edge_factor,
            a,
            b,
            c,
            seed,
        }
    }

    /// Vertices: `2^scale`.
    pub fn vertices(&self) -> u64 {
        1u64 << self.scale
    }

    /// The edge list; an error for a scale of 0 or above [`MAX_SCALE`], an
    /// edge factor of 0, or probabilities that are not a distribution.
    pub fn generate(&self) -> Result<EdgeList, String> {
        if self.scale == 0 || self.scale > MAX_SCALE || self.edge_factor == 0 {
            return Err(format!(
                "R-MAT needs 1 <= scale <= {MAX_SCALE} and edge factor >= 1 (got scale {}, edge factor {})",
                self.scale, self.edge_factor
            ));
        }
        let d = 1.0 - self.a - self.b - self.c;
        if [self.a, self.b, self.c, d]
            .iter()
            .any(|p| !(0.0..=1.0).contains(p))
        {
            return Err(format!(
                "R-MAT probabilities a={}, b={}, c={}, d={d} are not a distribution",
                self.a, self.b, self.c
            ));
        }
        let mut rng = SplitMix64(self.seed);
        let count = (self.edge_factor as u64) << self.scale;
        let edges = (0..count)
            .map(|_| {
                let (mut s, mut t) = (0u32, 0u32);
                for bit in (0..self.scale).rev() {
                    let r = rng.unit();
                    let (down, right) = if r < self.a {
                        (0, 0)
                    } else if r < self.a + self.b {
                        (0, 1)
                    } else if r < self.a + self.b + self.c {
                        (1, 0)
                    } else {
                        (1, 1)
                    };
                    s |= down << bit;
                    t |= right << bit;
                }
                (s, t)
            })
            .collect();
        Ok(EdgeList {
            vertices: self.vertices() as u32,
            edges,
        })
    }
}
