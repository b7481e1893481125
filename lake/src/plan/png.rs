//! A picture of a plan, like the paper's figures: time (plan positions)
//! to the right, address up; each placed request a filled rectangle
//! (static ones in blues, dynamic slots in oranges, shades alternating so
//! neighbours stay apart), a black line where the prologue ends.
//!
//! Written as a PNG (8-bit RGB, no interlace) with the zlib stream from
//! `flate2` and a table-driven CRC-32 (polynomial 0xEDB88320, as the PNG
//! specification gives it), so no image crate is needed.
//!
//! Concurrency: pure functions.

use std::io::Write as _;

use super::profile::Part;
use super::synth::Plan;

/// The eight bytes every PNG file starts with.
const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

/// CRC-32 of `bytes` as PNG chunks use it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut table = [0u32; 256];
    for (n, slot) in table.iter_mut().enumerate() {
        let mut c = n as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *slot = c;
    }
    let mut c = u32::MAX;
    for &b in bytes {
        c = table[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    c ^ u32::MAX
}

/// Appends one chunk: length, type, data, CRC of type and data.
fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// Encodes `rgb` (rows top first, 3 bytes a pixel) as a PNG.
pub fn encode_rgb(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    assert_eq!(
        rgb.len(),
        width as usize * height as usize * 3,
        "pixel count"
    );
    let mut raw = Vec::with_capacity(rgb.len() + height as usize);
    for row in rgb.chunks_exact(width as usize * 3) {
        raw.push(0); // filter type None
        raw.extend_from_slice(row);
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&raw).expect("writing to memory");
    let idat = z.finish().expect("writing to memory");
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, no filter set, no interlace
    let mut out = SIGNATURE.to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &idat);
    chunk(&mut out, b"IEND", &[]);
    out
}

impl Plan {
    /// The plan drawn `width` × `height` pixels, as a PNG.
    pub fn to_png(&self, width: u32, height: u32) -> Vec<u8> {
        let (w, h) = (width.max(1) as usize, height.max(1) as usize);
        let mut rgb = vec![255u8; w * h * 3];
        let total = (self.prologue_len + self.template_len).max(1) as f64;
        let arena = self.arena.max(1) as f64;
        let x_of = |pos: u64| ((pos as f64 / total) * w as f64) as usize;
        let y_of = |addr: u64| ((addr as f64 / arena) * h as f64) as usize;
        for (i, p) in self.requests.iter().enumerate() {
            let Some(off) = p.offset else { continue };
            let r = &p.request;
            let shade = (i % 3) as u8 * 30;
            let colour = match (r.dynamic, r.part) {
                (true, _) => [240 - shade, 140 - shade / 2, 40],
                (false, Part::Prologue) => [90 + shade, 110 + shade, 150 + shade],
                (false, Part::Template) => [40 + shade, 90 + shade, 200 - shade],
            };
            let (y0, y1) = (y_of(off), y_of(off + r.size).max(y_of(off) + 1).min(h));
            for &(s, e) in r.life.spans() {
                let (x0, x1) = (x_of(s), x_of(e).max(x_of(s) + 1).min(w));
                for y in y0..y1 {
                    // Row 0 is the top: addresses grow upwards.
                    let row = (h - 1 - y) * w;
                    for x in x0..x1 {
                        rgb[(row + x) * 3..(row + x) * 3 + 3].copy_from_slice(&colour);
                    }
                }
            }
        }
        let boundary = x_of(self.prologue_len).min(w - 1);
        for y in 0..h {
            rgb[(y * w + boundary) * 3..(y * w + boundary) * 3 + 3].fill(0);
        }
        encode_rgb(w as u32, h as u32, &rgb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    #[test]
    fn crc_and_chunks_follow_the_png_specification() {
        // The CRC-32 check value of the ASCII digits 1-9.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        let png = encode_rgb(2, 1, &[255, 0, 0, 0, 0, 255]);
        assert_eq!(png[..8], SIGNATURE);
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 2);
        // IDAT inflates to one filter byte and two pixels.
        let idat_len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
        assert_eq!(&png[37..41], b"IDAT");
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&png[41..41 + idat_len])
            .read_to_end(&mut raw)
            .unwrap();
        assert_eq!(raw, [0, 255, 0, 0, 0, 0, 255]);
        assert!(png.ends_with(&[0, 0, 0, 0, b'I', b'E', b'N', b'D', 0xAE, 0x42, 0x60, 0x82]));
    }
}
