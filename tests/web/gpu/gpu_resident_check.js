// In the page, for gpu_forward_page.js: the resident KV path (web/gpu/kv_resident.js) against the
// streamed one, for every format in kv_formats.js's encoder registry (kEncoderFormats), on one
// model. Per format, the same ids (a prompt, then the streamed run's greedy ids, kPositions in
// all) run twice on one device, pages of kPage positions (so several pages are written behind
// and attention spans several windows):
//   - streamed (NewSequence path 'stream': rows read back into the module's master each layer);
//   - resident (path 'auto', which must pick 'resident' for these specs).
// Checked: each resident step is 1 submit and 1 readback with no KV device submit; its logits
// equal the streamed step's bit for bit (the same kernels on the same bits: the WGSL encoders
// give kvq's codec bytes, checked by web.gpu_kv_encode, and attention has the same instructions
// for any windows); after the run, every full page of every layer in the resident run's master
// (written behind from the GPU) equals the streamed run's master page byte for byte
// (kvq_web_kv_read_page), and as many pages were written behind as the run filled.
// The per-token step time of each path is measured and returned for printing: under load on
// SwiftShader (a CPU emulation of a GPU) it shows dispatch overhead, not a claim.
import {GpuModelRunner} from '/web/gpu/gpu_engine.js';
import {kEncoderFormats} from '/web/gpu/kv_formats.js';

const kPage = 32;       // positions per page (the smallest the cache takes)
const kPositions = 72;  // two full pages and a partial tail

// Returns {checks, timing: {format: {stream_ms, resident_ms}}}; failures go to fail(what).
export async function CheckResidentPath(M, device, model, program, prompt_ids, name, fail) {
  const stream = await GpuModelRunner.Create(M, device, model, program);
  const resident = await GpuModelRunner.Create(M, device, model, program);
  const c = program.config;
  const timing = {};
  let checks = 0;
  const page_bytes = (runner) => JSON.parse(M.UTF8ToString(M._kvq_web_kv_page_layout(runner.kv, 0))).page_bytes;
  for (const format of kEncoderFormats) {
    const what = `${name} ${format} (resident vs streamed)`;
    stream.NewSequence(format, format, 0, kPage, {path: 'stream'});
    resident.NewSequence(format, format, 0, kPage);
    if (stream.path !== 'stream' || resident.path !== 'resident') {
      fail(`${what}: paths ${stream.path} and ${resident.path} (${resident.path_why})`);
      continue;
    }
    const ids = prompt_ids.slice(0, kPositions);
    const written_before = resident.counts.write_backs;
    let ms_stream = 0, ms_resident = 0;
    for (let p = 0; p < kPositions; ++p) {
      let t = performance.now();
      const a = await stream.Step(ids[p], {logits: true});
      ms_stream += performance.now() - t;
      const before = resident.counts;
      t = performance.now();
      const b = await resident.Step(ids[p], {logits: true});
      ms_resident += performance.now() - t;
      const after = resident.counts;
      const submits = after.submits - before.submits, readbacks = after.readbacks - before.readbacks;
      const device_submits = after.device_submits - before.device_submits;
      if (submits !== 1 || readbacks !== 1 || device_submits !== 0) {
        fail(`${what} position ${p}: ${submits} submits, ${readbacks} readbacks, ${device_submits} KV device submits ` +
             `(expected 1, 1, 0)`);
        break;
      }
      const at = b.logits.findIndex((v, i) => !Object.is(v, a.logits[i]));
      if (at >= 0 || a.token !== b.token) {
        fail(`${what} position ${p}: logit ${at} is ${b.logits[at]}, streamed ${a.logits[at]} (ids ${b.token}, ${a.token})`);
        break;
      }
      if (ids.length <= p + 1) ids.push(a.token);
      ++checks;
    }
    timing[format] = {stream_ms: +(ms_stream / kPositions).toFixed(2), resident_ms: +(ms_resident / kPositions).toFixed(2)};
    await resident.Drain();
    const full = Math.floor(kPositions / kPage);
    const written = resident.counts.write_backs - written_before;
    if (written !== full * c.n_layers) {
      fail(`${what}: ${written} pages written behind, the run filled ${full * c.n_layers}`);
    }
    const bytes = page_bytes(stream);
    const a = M._malloc(bytes), b = M._malloc(bytes);
    for (let layer = 0; layer < c.n_layers; ++layer) {
      const held = M._kvq_web_kv_positions(resident.kv, layer);
      if (held !== full * kPage) fail(`${what}: layer ${layer}'s master holds ${held} positions, expected ${full * kPage}`);
      for (let page = 0; page < full; ++page) {
        if (M._kvq_web_kv_read_page(stream.kv, layer, page, a) !== 0 ||
            M._kvq_web_kv_read_page(resident.kv, layer, page, b) !== 0) {
          fail(`${what}: read_page ${layer}/${page}: ${M.UTF8ToString(M._kvq_web_last_error())}`);
          continue;
        }
        const x = M.HEAPU8.subarray(a, a + bytes), y = M.HEAPU8.subarray(b, b + bytes);
        const at = x.findIndex((v, i) => v !== y[i]);
        if (at >= 0) fail(`${what}: layer ${layer} page ${page}: master byte ${at} is ${y[at]}, streamed ${x[at]}`);
        ++checks;
      }
    }
    M._free(a);
    M._free(b);
  }
  stream.Destroy();
  resident.Destroy();
  return {checks, timing};
}
