// In the page (headless Chromium, WebGPU on SwiftShader): web/gpu/kv_formats.js's WGSL encoders
// against kvq's C++ codecs, on the rows gpu_attention_fixture wrote for every registered format
// whose K and V are one row per block (random rows and rows of edge values: ±0, subnormals, f16
// ties and overflow, huge numbers, ±inf, NaNs, int8 rounding ties, scales that round to 0 or
// overflow f16). Per format with a GPU encoder, for K and V:
//   1. all rows encoded at once == kvq's encode_block bytes, bit for bit;
//   2. the rows encoded one at a time into a buffer of other bytes, from byte 3 (rows straddling
//      u32 words, as a page's rows do) == those bytes there, and the bytes around them untouched.
// Formats without a GPU encoder are listed (their rows go through the module's C++ codecs).
// Returns {cases, checks, failures, without_encoder, seconds}.
import {GpuKvEncoder, kEncoderFormats} from '/web/gpu/kv_formats.js';

async function Read(device, buffer, bytes) {
  const readback = device.createBuffer({size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  const encoder = device.createCommandEncoder();
  encoder.copyBufferToBuffer(buffer, 0, readback, 0, bytes);
  device.queue.submit([encoder.finish()]);
  await readback.mapAsync(GPUMapMode.READ);
  const out = new Uint8Array(readback.getMappedRange().slice(0));
  readback.unmap();
  readback.destroy();
  return out;
}

function FirstDifference(a, b) {
  if (a.length !== b.length) return `${a.length} vs ${b.length} bytes`;
  for (let i = 0; i < a.length; ++i) if (a[i] !== b[i]) return `byte ${i}: ${a[i]} vs ${b[i]}`;
  return '';
}

export async function RunGpuKvEncodeTests(fixture_url) {
  const t0 = performance.now();
  const failures = [], without_encoder = [];
  const fail = (m) => failures.push(m);
  let checks = 0, cases = 0;
  const adapter = await navigator.gpu?.requestAdapter();
  if (!adapter) return {cases, checks, failures: ['no WebGPU adapter'], without_encoder, seconds: 0};
  const device = await adapter.requestDevice();
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const manifest = await (await fetch(`${fixture_url}/manifest.json`)).json();
  if (!manifest.encode?.length) fail('the fixture has no encode cases');
  for (const c of manifest.encode ?? []) {
    if (!kEncoderFormats.includes(c.format)) {
      without_encoder.push(c.format);
      continue;
    }
    ++cases;
    const file = new Uint8Array(await (await fetch(`${fixture_url}/${c.file}`)).arrayBuffer());
    const section = (name) => file.subarray(c.sections[name].offset, c.sections[name].offset + c.sections[name].bytes);
    const x = section('x');
    const x_buffer = device.createBuffer({size: Math.ceil(x.length / 16) * 16, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
    device.queue.writeBuffer(x_buffer, 0, x);
    const row_floats = c.n_kv_heads * c.head_dim;
    for (const [tensor, block_bytes] of [['k', c.k_block_bytes], ['v', c.v_block_bytes]]) {
      const want = section(`${tensor}_blocks`), name = `${c.format} ${tensor}`;
      const gpu = new GpuKvEncoder(device, c.format, {n_kv_heads: c.n_kv_heads, head_dim: c.head_dim, block_bytes});
      // 1. every row at once.
      const size = Math.ceil((want.length + 8) / 16) * 16;
      const out = device.createBuffer({size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST});
      let encoder = device.createCommandEncoder();
      gpu.Record(encoder, x_buffer, c.rows, out, 0);
      device.queue.submit([encoder.finish()]);
      ++checks;
      const why = FirstDifference((await Read(device, out, size)).subarray(0, want.length), want);
      if (why) fail(`${name}: the GPU's bytes differ from kvq's codec (${why}; row ${Math.floor(parseInt(why.split(' ')[1]) / block_bytes)})`);
      // 2. a row at a time, from byte 3, among other bytes.
      const background = new Uint8Array(size).map((_, i) => (i * 37 + 11) & 0xff);
      device.queue.writeBuffer(out, 0, background);
      const row_buffer = device.createBuffer({size: Math.ceil(row_floats * 4 / 16) * 16, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
      for (let r = 0; r < c.rows; ++r) {
        device.queue.writeBuffer(row_buffer, 0, x, r * row_floats * 4, row_floats * 4);
        encoder = device.createCommandEncoder();
        gpu.Record(encoder, row_buffer, 1, out, 3 + r * block_bytes);
        device.queue.submit([encoder.finish()]);
      }
      const expected = background.slice();
      expected.set(want, 3);
      ++checks;
      const why_rows = FirstDifference(await Read(device, out, size), expected);
      if (why_rows) fail(`${name}: rows encoded one at a time from byte 3 differ (${why_rows})`);
      out.destroy();
      row_buffer.destroy();
    }
    x_buffer.destroy();
  }
  device.destroy();
  return {cases, checks, failures, without_encoder, seconds: (performance.now() - t0) / 1000};
}
