// In the page (headless Chromium, WebGPU on SwiftShader): web/gpu/kv_formats.js's WGSL encoders
// against kvq's C++ codecs, on the rows gpu_attention_fixture wrote for every registered format
// whose V is one row per block and K one row or a group of 32 (random rows and rows of edge
// values: ±0, subnormals, f16 ties and overflow, huge numbers, ±inf, NaNs, int8 rounding ties,
// scales that round to 0 or overflow f16, an int4 scale max|x| / 7 that is an f16 tie (a division
// off by an ulp rounds it up), E4M3 and E2M1 rounding ties and saturation, rows of f32
// subnormals; for the K groups (KIVI, fp8-e4m3), channels of one repeated value, channels holding
// the edge values and a group of finite numbers). Per format with a GPU encoder, for K and V:
//   1. all rows encoded at once == kvq's encode_block bytes, bit for bit;
//   2. the blocks (a row, or a K group of 32) encoded one at a time into a buffer of other
//      bytes, from byte 3 (blocks straddling u32 words, as a page's rows do) == those bytes there,
//      and the bytes around them untouched.
// Formats without a GPU encoder are listed (their rows go through the module's C++ codecs).
// Returns {cases, checks, failures, without_encoder, seconds}.
import {GpuKvEncoder, kEncoderFormats, kGroupKeyEncoderFormats} from '/web/gpu/kv_formats.js';

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
    if (!kEncoderFormats.includes(c.format) && !kGroupKeyEncoderFormats.includes(c.format)) {
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
      const gpu = new GpuKvEncoder(device, c.format, {n_kv_heads: c.n_kv_heads, head_dim: c.head_dim, block_bytes}, tensor);
      const block_rows = tensor === 'k' ? c.k_rows_per_block : 1;
      if (gpu.rows_per_block !== block_rows) fail(`${name}: the encoder takes blocks of ${gpu.rows_per_block} rows, kvq's codec ${block_rows}`);
      // 1. every row at once.
      const size = Math.ceil((want.length + 8) / 16) * 16;
      const out = device.createBuffer({size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST});
      let encoder = device.createCommandEncoder();
      gpu.Record(encoder, x_buffer, c.rows, out, 0);
      device.queue.submit([encoder.finish()]);
      ++checks;
      const why = FirstDifference((await Read(device, out, size)).subarray(0, want.length), want);
      if (why) fail(`${name}: the GPU's bytes differ from kvq's codec (${why}; block ${Math.floor(parseInt(why.split(' ')[1]) / block_bytes)})`);
      // 2. a block at a time, from byte 3, among other bytes.
      const background = new Uint8Array(size).map((_, i) => (i * 37 + 11) & 0xff);
      device.queue.writeBuffer(out, 0, background);
      const block_floats = block_rows * row_floats;
      const row_buffer = device.createBuffer({size: Math.ceil(block_floats * 4 / 16) * 16, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
      for (let b = 0; b < c.rows / block_rows; ++b) {
        device.queue.writeBuffer(row_buffer, 0, x, b * block_floats * 4, block_floats * 4);
        encoder = device.createCommandEncoder();
        gpu.Record(encoder, row_buffer, block_rows, out, 3 + b * block_bytes);
        device.queue.submit([encoder.finish()]);
      }
      const expected = background.slice();
      expected.set(want, 3);
      ++checks;
      const why_rows = FirstDifference(await Read(device, out, size), expected);
      if (why_rows) fail(`${name}: blocks encoded one at a time from byte 3 differ (${why_rows})`);
      out.destroy();
      row_buffer.destroy();
    }
    x_buffer.destroy();
  }
  device.destroy();
  return {cases, checks, failures, without_encoder, seconds: (performance.now() - t0) / 1000};
}

// Write-behind in miniature, per format with a GPU encoder: a kvq::KvCache in the module (the
// bundle's kvq.js) gets 3 pages of rows whose bytes the GPU encoded into page images in the
// cache's layout (kvq_web_kv_page_layout: K rows from 0, V rows from value_offset), each page
// copied into a staging buffer, mapped after its commands were submitted and handed to the
// master whole (kvq_web_kv_append_pages), then 10 more rows by Append; the master's bytes, page
// by page, equal a cache that appended every row with kvq's codecs. Returns as RunGpuKvEncodeTests.
export async function RunGpuWriteBehindTests(bundle_url) {
  const {LoadModule, Rng, Rows} = await import('/test/gpu_kv_device_page.js');
  const t0 = performance.now();
  const failures = [];
  const fail = (m) => failures.push(m);
  let checks = 0, cases = 0;
  const adapter = await navigator.gpu?.requestAdapter();
  if (!adapter) return {cases, checks, failures: ['no WebGPU adapter'], without_encoder: [], seconds: 0};
  const device = await adapter.requestDevice();
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const M = await LoadModule(bundle_url);
  const Error_ = () => M.UTF8ToString(M._kvq_web_last_error());
  const s = {n_kv_heads: 2, head_dim: 16}, elems = s.n_kv_heads * s.head_dim, kPage = 64, kPages = 3, kTail = 10;
  const n = kPages * kPage + kTail;
  const formats = JSON.parse(M.UTF8ToString(M._kvq_web_formats())).map((x) => x.name);
  const without_encoder = formats.filter((f) => !kEncoderFormats.includes(f));
  const Cache = (spec) => {
    const p = M._malloc(spec.length + 1);
    M.stringToUTF8(spec, p, spec.length + 1);
    const h = M._kvq_web_kv_new(p, p, 1, s.n_kv_heads, s.head_dim, n, kPage, 0, 10000.0, 1, s.head_dim);
    M._free(p);
    if (!h) fail(`${spec}: ${Error_()}`);
    return h;
  };
  const Append = (h, k, v, first, rows) => {
    const kp = M._malloc(Math.max(4, rows * elems * 4)), vp = M._malloc(Math.max(4, rows * elems * 4));
    M.HEAPF32.set(k.subarray(first * elems, (first + rows) * elems), kp >> 2);
    M.HEAPF32.set(v.subarray(first * elems, (first + rows) * elems), vp >> 2);
    if (M._kvq_web_kv_append(h, 0, kp, vp, rows) !== 0) fail(`append: ${Error_()}`);
    M._free(kp);
    M._free(vp);
  };
  for (const spec of formats.filter((f) => kEncoderFormats.includes(f))) {
    ++cases;
    const rng = Rng(spec.length * 131 + 7);
    const k = Rows(n * elems, rng, 2), v = Rows(n * elems, rng, 2);
    const cpu = Cache(spec), gpu_master = Cache(spec);
    if (!cpu || !gpu_master) continue;
    Append(cpu, k, v, 0, n);
    const layout = JSON.parse(M.UTF8ToString(M._kvq_web_kv_page_layout(gpu_master, 0)));
    // One row's block, the codecs' (the regions may be padded past kPage blocks): one-row K and V.
    const block_bytes = layout.value_block_bytes;
    ++checks;
    if (!(block_bytes > 0) || layout.key_block_bytes !== block_bytes || layout.value_offset < kPage * block_bytes ||
        layout.page_bytes < layout.value_offset + kPage * block_bytes) {
      fail(`${spec}: page layout ${JSON.stringify(layout)} does not hold ${kPage} one-row blocks per tensor`);
      continue;
    }
    const page_size = Math.ceil(layout.page_bytes / 16) * 16;
    const page_image = device.createBuffer({size: page_size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST});
    const gpu = new GpuKvEncoder(device, spec, {...s, block_bytes});
    const xs = ['k', 'v'].map(() => device.createBuffer({size: kPage * elems * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST}));
    const staging = [];
    for (let page = 0; page < kPages; ++page) {
      // The page's K and V rows, encoded into the page image (zeros elsewhere), copied to staging.
      const encoder = device.createCommandEncoder();
      encoder.clearBuffer(page_image);
      const out = device.createBuffer({size: page_size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
      [k, v].forEach((x, i) => device.queue.writeBuffer(xs[i], 0, x, page * kPage * elems, kPage * elems));
      gpu.Record(encoder, xs[0], kPage, page_image, 0);
      // A second Record reuses the encoder's params and scales: its own command buffer, after.
      device.queue.submit([encoder.finish()]);
      const second = device.createCommandEncoder();
      gpu.Record(second, xs[1], kPage, page_image, layout.value_offset);
      second.copyBufferToBuffer(page_image, 0, out, 0, page_size);
      device.queue.submit([second.finish()]);
      staging.push(out.mapAsync(GPUMapMode.READ).then(() => out));  // mapped later: write-behind
    }
    for (const pending of staging) {
      const out = await pending;
      const bytes = new Uint8Array(out.getMappedRange(), 0, layout.page_bytes);
      const p = M._malloc(layout.page_bytes);
      M.HEAPU8.set(bytes, p);
      if (M._kvq_web_kv_append_pages(gpu_master, 0, p, 1) !== 0) fail(`${spec}: append_pages: ${Error_()}`);
      M._free(p);
      out.unmap();
      out.destroy();
    }
    Append(gpu_master, k, v, kPages * kPage, kTail);
    for (let page = 0; page <= kPages; ++page) {
      const a = M._malloc(layout.page_bytes), b = M._malloc(layout.page_bytes);
      if (M._kvq_web_kv_read_page(gpu_master, 0, page, a) !== 0 || M._kvq_web_kv_read_page(cpu, 0, page, b) !== 0) {
        fail(`${spec}: read_page: ${Error_()}`);
      }
      ++checks;
      const why = FirstDifference(M.HEAPU8.slice(a, a + layout.page_bytes), M.HEAPU8.slice(b, b + layout.page_bytes));
      if (why) fail(`${spec}: page ${page} of the master written behind from the GPU differs from the CPU's (${why})`);
      M._free(a);
      M._free(b);
    }
    for (const b of [page_image, ...xs]) b.destroy();
    M._kvq_web_kv_free(cpu);
    M._kvq_web_kv_free(gpu_master);
  }
  device.destroy();
  return {cases, checks, failures, without_encoder, seconds: (performance.now() - t0) / 1000};
}
