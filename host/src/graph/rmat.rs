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

/// SplitMix64 (Steele, Lea & Flood, OOPSLA 2014): small, fast, seedable;
/// also what the graph tests and benchmark pick updates with.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
    const MIX1: u64 = 0xbf58_476d_1ce4_e5b9;
    const MIX2: u64 = 0x94d0_49bb_1331_11eb;
    /// Bits of an `f64` mantissa (53) taken from the top of the output.
    const MANTISSA_BITS: u32 = f64::MANTISSA_DIGITS;

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(Self::GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(Self::MIX1);
        z = (z ^ (z >> 27)).wrapping_mul(Self::MIX2);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is below 2^-32 for the
    /// sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> (u64::BITS - Self::MANTISSA_BITS)) as f64
            / (1u64 << Self::MANTISSA_BITS) as f64
    }
}

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
