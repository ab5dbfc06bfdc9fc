// SHA-256 (FIPS 180-4) of a string's UTF-8 bytes, as 64 lower-case hex digits: what
// aso/model.py request_id computes with hashlib, for validate_doc_update (neither CouchDB's
// JavaScript nor the embedded store's has a crypto library). ES5 only, 32-bit integer arithmetic.

var K = [
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
];

// A JavaScript string is UTF-16: a surrogate pair is one code point (four UTF-8 bytes). A lone
// surrogate has no UTF-8 form (Python refuses to encode it): callers refuse such text first
// (validate_doc_update's schema check runs before the id is hashed).
function utf8(text) {
  var bytes = [], i, c, next;
  for (i = 0; i < text.length; i++) {
    c = text.charCodeAt(i);
    if (c >= 0xD800 && c <= 0xDBFF && i + 1 < text.length) {
      next = text.charCodeAt(i + 1);
      if (next >= 0xDC00 && next <= 0xDFFF) {
        c = 0x10000 + ((c - 0xD800) * 0x400) + (next - 0xDC00);
        i++;
      }
    }
    if (c < 0x80) {
      bytes.push(c);
    } else if (c < 0x800) {
      bytes.push(0xC0 | (c >> 6), 0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      bytes.push(0xE0 | (c >> 12), 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F));
    } else {
      bytes.push(0xF0 | (c >> 18), 0x80 | ((c >> 12) & 0x3F), 0x80 | ((c >> 6) & 0x3F),
        0x80 | (c & 0x3F));
    }
  }
  return bytes;
}

function rotr(x, n) {
  return (x >>> n) | (x << (32 - n));
}

// The message padded to whole 64-byte blocks: a 1 bit, zeros, the length in bits (64-bit big
// endian; the high word by division, as bit operations are 32-bit).
function padded(bytes) {
  var out = bytes.slice(), bits = bytes.length * 8, i;
  out.push(0x80);
  while (out.length % 64 !== 56) { out.push(0); }
  var high = Math.floor(bits / 0x100000000), low = bits >>> 0;
  for (i = 24; i >= 0; i -= 8) { out.push((high >>> i) & 0xFF); }
  for (i = 24; i >= 0; i -= 8) { out.push((low >>> i) & 0xFF); }
  return out;
}

function compress(h, block, offset) {
  var w = [], t, s0, s1;
  for (t = 0; t < 16; t++) {
    var at = offset + 4 * t;
    w[t] = (block[at] << 24) | (block[at + 1] << 16) | (block[at + 2] << 8) | block[at + 3];
  }
  for (t = 16; t < 64; t++) {
    s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >>> 3);
    s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >>> 10);
    w[t] = (w[t - 16] + s0 + w[t - 7] + s1) | 0;
  }
  var a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (t = 0; t < 64; t++) {
    var t1 = (k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t]) | 0;
    var t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
    k = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
  }
  var next = [a, b, c, d, e, f, g, k];
  for (t = 0; t < 8; t++) { h[t] = (h[t] + next[t]) | 0; }
}

function hex(text) {
  var h = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
    0x5be0cd19];
  var message = padded(utf8(String(text))), out = '', i;
  for (i = 0; i < message.length; i += 64) { compress(h, message, i); }
  for (i = 0; i < 8; i++) { out += ('0000000' + (h[i] >>> 0).toString(16)).slice(-8); }
  return out;
}

module.exports = {hex: hex, utf8: utf8};
