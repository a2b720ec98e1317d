// The block matmuls of the step program's 'rows' kernel and the terms of its 'lanes' one
// (MatmulLanesTermsWgsl; step_kernels.js's WeightOpsWgsl holds that kernel): y = W x for
// the dims.tokens tokens of a prefill block in one dispatch, for every weight type and layout the
// matvec reads. One invocation per row, the tokens in groups of kMatmulTokens: per weight block the
// row's scales and codes are read once for the group (the codes packed into u32 words, a byte
// each: every code of these types fits an int8), then each token's sum takes the matvec's
// expression in the matvec's order: the same f32 operations on the same operands (the integer dots
// are exact, and wrap alike where they would not be), so each token's y has its matvec's bits.
// tests/web/gpu/gpu_attention_page.js (CheckMatmul) checks that per type and layout.
//
// Buffers, per token t of the block (the matvec's, strided): x [tokens][dims.x_stride] (an f32
// activation), or its quantisation xq [tokens][cols] and xd [tokens][dims.xd_stride]; y
// [tokens][dims.y_stride], the piece's rows at row0 of each token's slice.

/** Tokens a matmul invocation keeps sums for: each weight block is read once per this many tokens. */
export const kMatmulTokens = 8;

// Per type read as words (w_u32 of 4 code bytes, contiguous in both layouts): the codes of an
// activation block, each handed to emit(code, j) with j its element in the block (WGSL
// expressions), in a scope with row, block and first. The element loop's codes, fewer loads.
const kWordCodes = {
  // Q1_0: 32 sign bits, LSB first; code ±1.
  q1_0: (emit) => `let bits = w_u32(w_code_byte(row, block, first / 8u));
  for (var j = 0u; j < 32u; j++) { ${emit('select(-1, 1, ((bits >> j) & 1u) == 1u)', 'j')} }`,
  // Q4_0: byte s holds element s's code + 8 in its low nibble, element 16 + s's in its high one.
  q4_0: (emit) => `for (var k = 0u; k < 4u; k++) {
    let word = w_u32(w_code_byte(row, block, 4u * k));
    for (var i = 0u; i < 4u; i++) {
      let byte = (word >> (8u * i)) & 255u;
      ${emit('(i32(byte & 15u) - 8)', '4u * k + i')}
      ${emit('(i32(byte >> 4u) - 8)', '16u + 4u * k + i')}
    }
  }`,
  // Q8_0: byte j is element j's int8 code.
  q8_0: (emit) => `for (var k = 0u; k < 8u; k++) {
    let word = w_u32(w_code_byte(row, block, 4u * k));
    for (var i = 0u; i < 4u; i++) { ${emit('(i32(word << (24u - 8u * i)) >> 24u)', '4u * k + i')} }
  }`,
};

/**
 * WGSL statements handing each code of the activation block that starts at element `first` of
 * weight block `block` of `row` (a block type that quantises its activation, not a K-quant) to
 * emit(code, j): an i32 expression and its element j in the activation block. The statements
 * emit returns are in order of j, one per code; the integer sums they make are exact (no sum comes
 * near 2^31), so any order gives the same integers.
 */
export function BlockCodesWgsl(type, emit) {
  return kWordCodes[type]?.(emit) ?? `for (var j = 0u; j < 32u; j++) { ${emit('w_code(row, block, first + j)', 'j')} }`;
}

// The entry point around `body`, which adds weight block by weight block into the group's sums and
// leaves token t's y in `result(t)`.
function Matmul(row_lanes, doc, sums, body, result) {
  return /* wgsl */ `
// MatMul over a block of tokens (matmul_kernels.js): ${doc}
@compute @workgroup_size(${row_lanes})
fn matmul(@builtin(global_invocation_id) id: vec3u) {
  let row = id.x + id.y * ${row_lanes}u * 32768u;
  if (row >= dims.rows) { return; }
  for (var t0 = 0u; t0 < dims.tokens; t0 += ${kMatmulTokens}u) {
    let in_group = min(${kMatmulTokens}u, dims.tokens - t0);  // tokens in this group
    ${sums.map((s) => `var ${s} = array<f32, ${kMatmulTokens}>();  // per token of the group, from zero`).join('\n    ')}
    ${body}
    for (var t = 0u; t < in_group; t++) { y[(t0 + t) * dims.y_stride + dims.row0 + row] = ${result}; }
  }
}`;
}

// The packed codes are declared with an explicit zero value; declared bare inside the
// block loop they kept the previous block's bits on SwiftShader (the matmul checks failed so).
// Byte k of packed codes (8 words, 4 int8 codes each), sign-extended.
const kCodeOf = /* wgsl */ `
fn packed_code(codes: array<u32, 8>, k: u32) -> i32 {
  return i32(codes[k / 4u] << (24u - 8u * (k % 4u))) >> 24u;
}`;

/**
 * WGSL of the `matmul` entry point of weights of `type` (WeightBlock's info: {elems, kquant,
 * quantized_activation, min}) over WeightOpsWgsl's bindings and readers; row_lanes: invocations per
 * workgroup (a row each).
 */
// The loop body's start for activation block b (32 elements) of a block-quantised row of `type`
// whose weight blocks hold `elems` elements: the weight block, the block's scale d, and its 32
// codes packed into 8 words (code first + j in byte j), read once for the token group (as words
// where the type's codes are: BlockCodesWgsl).
function BlockCodes(type, elems) {
  const pack = (code, j) => `codes[(${j}) / 4u] |= (u32(${code}) & 255u) << (8u * ((${j}) % 4u));`;
  return /* wgsl */ `      let block = (b * 32u) / ${elems}u;
      let first = (b * 32u) % ${elems}u;
      let d = w_scale(row, block);
      var codes = array<u32, 8>();  // code first + j in byte j (zeroed explicitly: see packed_code)
      ${BlockCodesWgsl(type, pack)}
`;
}

export function MatmulWgsl(type, info, row_lanes) {
  if (type === 'q1_0') {
    // Q1_0's 32 weights of an activation block are 32 sign bits: its 4 code bytes as one word.
    return Matmul(row_lanes, `Q1_0: per activation block b, the row's scale and 32 sign bits read
// once for the group; each token's Σ_b (d_w · d_x) · I_b in f32 in order of b (I_b = Σ code·q).`, ['sum'], `
    for (var b = 0u; b < dims.cols / 32u; b++) {
      let block = (b * 32u) / ${info.elems}u;
      let s = ((b * 32u) % ${info.elems}u) / 8u;  // the first of the 4 code bytes
      let bits = w_u8(w_code_byte(row, block, s)) | (w_u8(w_code_byte(row, block, s + 1u)) << 8u) |
                 (w_u8(w_code_byte(row, block, s + 2u)) << 16u) | (w_u8(w_code_byte(row, block, s + 3u)) << 24u);
      let d = w_scale(row, block);
      for (var t = 0u; t < in_group; t++) {
        let xo = (t0 + t) * dims.cols + b * 32u;
        var dot = 0;
        for (var j = 0u; j < 32u; j++) { dot = dot + select(-1, 1, ((bits >> j) & 1u) == 1u) * xq[xo + j]; }
        sum[t] = sum[t] + (d * xd[(t0 + t) * dims.xd_stride + b]) * f32(dot);
      }
    }`, 'sum[t]');
  }
  if (info.kquant) {
    return kCodeOf + Matmul(row_lanes, `a K-quant, the matvec's (step_kernels.js) per token: per
// activation block b (two 16-element sub-blocks j) the row's d, dmin, sc_j, m_j and 32 codes read
// once for the group; per token dot = Σ_j sc_j·Σ code·q, mins = Σ_j m_j·Σ q (exact integers), then
// acc += (d·d_x)·dot, macc += (dmin·d_x)·mins in f32 in order of b; y = acc − macc.`, ['acc', 'macc'], `
    for (var b = 0u; b < dims.cols / 32u; b++) {
      let sb = b / 8u;
      let j0 = (b % 8u) * 2u;  // the first of the block's two sub-blocks
      let d = kq_d(row, sb);
      let dmin = kq_dmin(row, sb);
      let sc = vec2i(kq_sc(row, sb, j0), kq_sc(row, sb, j0 + 1u));
      let m = vec2i(kq_m(row, sb, j0), kq_m(row, sb, j0 + 1u));
      var codes = array<u32, 8>();  // element 16·j0 + e's code in byte e (zeroed explicitly: see packed_code)
      for (var e = 0u; e < 32u; e++) { codes[e / 4u] |= (u32(kq_code(row, sb, 16u * j0 + e)) & 255u) << (8u * (e % 4u)); }
      for (var t = 0u; t < in_group; t++) {
        let xo = (t0 + t) * dims.cols + b * 32u;
        var dot = 0;
        var mins = 0;
        for (var h = 0u; h < 2u; h++) {
          var sub = 0;
          var sum16 = 0;
          for (var l = 0u; l < 16u; l++) {
            let q = xq[xo + 16u * h + l];
            sub = sub + packed_code(codes, 16u * h + l) * q;
            sum16 = sum16 + q;
          }
          dot = dot + sc[h] * sub;
          mins = mins + m[h] * sum16;
        }
        let dx = xd[(t0 + t) * dims.xd_stride + b];
        acc[t] = acc[t] + (d * dx) * f32(dot);
        macc[t] = macc[t] + (dmin * dx) * f32(mins);
      }
    }`, 'acc[t] - macc[t]');
  }
  if (info.quantized_activation && info.min) {
    return kCodeOf + Matmul(row_lanes, `the activation quantised, weights with a min (Q4_1, Q5_1):
// the matvec's (step_kernels.js) per token: per activation block b the row's scale, min and 32
// codes read once for the group; each token's Σ_b (d_w · d_x) · I_b and Σ_b (m · d_x) · Σq in f32
// in order of b (I_b = Σ code·q and Σq exact), added last.`, ['sum', 'min_sum'], `
    for (var b = 0u; b < dims.cols / 32u; b++) {
${BlockCodes(type, info.elems)}      let m = w_min(row, block);
      for (var t = 0u; t < in_group; t++) {
        let xo = (t0 + t) * dims.cols + b * 32u;
        var dot = 0;
        var q_sum = 0;
        for (var j = 0u; j < 32u; j++) {
          dot = dot + packed_code(codes, j) * xq[xo + j];
          q_sum = q_sum + xq[xo + j];
        }
        let dx = xd[(t0 + t) * dims.xd_stride + b];
        sum[t] = sum[t] + (d * dx) * f32(dot);
        min_sum[t] = min_sum[t] + (m * dx) * f32(q_sum);
      }
    }`, 'sum[t] + min_sum[t]');
  }
  if (info.quantized_activation) {
    return kCodeOf + Matmul(row_lanes, `the activation quantised, the matvec's (step_kernels.js) per
// token: per activation block b the row's scale and 32 codes read once for the group; each token's
// Σ_b (d_w · d_x) · I_b in f32 in order of b (I_b = Σ code·q, exact).`, ['sum'], `
    for (var b = 0u; b < dims.cols / 32u; b++) {
${BlockCodes(type, info.elems)}      for (var t = 0u; t < in_group; t++) {
        let xo = (t0 + t) * dims.cols + b * 32u;
        var dot = 0;
        for (var j = 0u; j < 32u; j++) { dot = dot + packed_code(codes, j) * xq[xo + j]; }
        sum[t] = sum[t] + (d * xd[(t0 + t) * dims.xd_stride + b]) * f32(dot);
      }
    }`, 'sum[t]');
  }
  return Matmul(row_lanes, `an f32 activation, the matvec's (step_kernels.js) per token: each
// weight decoded once for the group; each token's Σ_c w·x in f32 in order of c.`, ['sum'], `
    for (var c = 0u; c < dims.cols; c++) {
      let w = w_elem(row, c);
      for (var t = 0u; t < in_group; t++) { sum[t] = sum[t] + w * x[(t0 + t) * dims.x_stride + c]; }
    }`, 'sum[t]');
}

/**
 * WGSL of `matmul_terms(row, b, t0, in_group, slot)` for the 'lanes' matmul (step_kernels.js):
 * activation block b's terms of `row` for tokens t0 .. t0 + in_group, token t's written to
 * mm_terms[slot + t·tile_blocks]: per token the matvec's matvec_term (the same exact integers, then
 * the same f32 operations on them), the weight block read once for the token group instead of once
 * per token. Four tokens' integer sums are the lanes of a vec4i; a token past the group reads the
 * group's last one's codes (in bounds; its terms are not stored).
 */
export function MatmulLanesTermsWgsl(type, info, tile_blocks) {
  if (kMatmulTokens !== 8) throw new Error(`matmul_terms keeps 8 tokens in two vec4i (kMatmulTokens ${kMatmulTokens})`);
  // Token t's value of a pair of vec4i (tokens 0-3, 4-7).
  const pick = (name) => `select(${name}_hi[t % 4u], ${name}_lo[t % 4u], t < 4u)`;
  let body, terms;
  if (info.kquant) {
    body = `  let sb = b / 8u;
  var dot_lo = vec4i(0); var dot_hi = vec4i(0);    // Σ_j sc_j·Σ code·q
  var mins_lo = vec4i(0); var mins_hi = vec4i(0);  // Σ_j m_j·Σ q
  for (var h = 0u; h < 2u; h++) {
    let j = (b % 8u) * 2u + h;
    var sub_lo = vec4i(0); var sub_hi = vec4i(0);
    var s16_lo = vec4i(0); var s16_hi = vec4i(0);
    for (var l = 0u; l < 16u; l++) {
      let c = kq_code(row, sb, 16u * j + l);
      let x_lo = xq4(q_lo, 16u * h + l);
      let x_hi = xq4(q_hi, 16u * h + l);
      sub_lo = sub_lo + c * x_lo; sub_hi = sub_hi + c * x_hi;
      s16_lo = s16_lo + x_lo; s16_hi = s16_hi + x_hi;
    }
    let sc = kq_sc(row, sb, j);
    let m = kq_m(row, sb, j);
    dot_lo = dot_lo + sc * sub_lo; dot_hi = dot_hi + sc * sub_hi;
    mins_lo = mins_lo + m * s16_lo; mins_hi = mins_hi + m * s16_hi;
  }
  let d = kq_d(row, sb);
  let dmin = kq_dmin(row, sb);`;
    terms = `vec2f((d * dx) * f32(${pick('dot')}), (dmin * dx) * f32(${pick('mins')}))`;
  } else {
    body = `  let block = (b * 32u) / ${info.elems}u;
  let first = (b * 32u) % ${info.elems}u;
  var dot_lo = vec4i(0); var dot_hi = vec4i(0);  // Σ code·q
  ${BlockCodesWgsl(type, (code, j) => `{ let c = ${code}; dot_lo = dot_lo + c * xq4(q_lo, ${j}); dot_hi = dot_hi + c * xq4(q_hi, ${j}); }`)}
  let d = w_scale(row, block);${info.min ? `
  var qs_lo = vec4i(0); var qs_hi = vec4i(0);  // Σq
  for (var j = 0u; j < 32u; j++) { qs_lo = qs_lo + xq4(q_lo, j); qs_hi = qs_hi + xq4(q_hi, j); }
  let m = w_min(row, block);` : ''}`;
    terms = `vec2f((d * dx) * f32(${pick('dot')}), ${info.min ? `(m * dx) * f32(${pick('qs')})` : '0.0'})`;
  }
  return /* wgsl */ `
// Codes j of four tokens' activation blocks starting at xq[o.x], xq[o.y], xq[o.z], xq[o.w].
fn xq4(o: vec4u, j: u32) -> vec4i { return vec4i(xq[o.x + j], xq[o.y + j], xq[o.z + j], xq[o.w + j]); }

// Activation block b's terms of row for the token group (matmul_kernels.js, MatmulLanesTermsWgsl).
fn matmul_terms(row: u32, b: u32, t0: u32, in_group: u32, slot: u32) {
  let last = vec4u(in_group - 1u);
  let q_lo = (vec4u(t0) + min(vec4u(0u, 1u, 2u, 3u), last)) * dims.cols + vec4u(b * 32u);
  let q_hi = (vec4u(t0) + min(vec4u(4u, 5u, 6u, 7u), last)) * dims.cols + vec4u(b * 32u);
${body}
  for (var t = 0u; t < in_group; t++) {
    let dx = xd[(t0 + t) * dims.xd_stride + b];
    mm_terms[slot + t * ${tile_blocks}u] = ${terms};
  }
}`;
}
