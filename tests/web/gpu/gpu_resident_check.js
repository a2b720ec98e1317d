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
// A third runner prefills the same ids in blocks (GpuModelRunner.Prefill: kBlocks, one crossing a
// page boundary and filling a page inside the block): each block is exactly 1 submit and 1
// readback (no KV device submit), its last position's logits equal the resident token-by-token
// run's bit for bit (the same kernels per token, only their parameters copied from block
// buffers), and its master pages equal the streamed run's byte for byte. The first block's call
// allows 6·n_layers uniform slots (Prefill's uniform_slots): the runner counts n_layers × (2 + 1
// page) per token, so it runs as blocks of 2, 2 and 1 token (3 submits and readbacks) with the
// same logits.
// Attention in a block is query-blocked (kv_resident.js's RecordBlock): per layer one attend
// dispatch per page the block's last position reaches, for all its tokens (counted by the resident
// cache, checked exactly), where per-token attention took one per page per token (also returned).
// The per-token step time of each path is measured and returned for printing: under load on
// SwiftShader (a CPU emulation of a GPU) it shows dispatch overhead, not a claim.
import {GpuModelRunner} from '/web/gpu/gpu_engine.js';
import {kEncoderFormats} from '/web/gpu/kv_formats.js';

const kPage = 32;       // positions per page (the smallest the cache takes)
const kPositions = 72;  // two full pages and a partial tail
const kBlocks = [5, 40, 27];  // prefill blocks over the kPositions: positions 0-4, 5-44, 45-71

// formats: the encoder formats to run (all of kEncoderFormats unless given).
// Returns {checks, timing: {format: {stream_ms, resident_ms}}, attend_dispatches: {blocked, per_token}
// (the block runs' prefill attention, summed over formats)}; failures go to fail(what).
export async function CheckResidentPath(M, device, model, program, prompt_ids, name, fail, formats = kEncoderFormats) {
  const stream = await GpuModelRunner.Create(M, device, model, program);
  const resident = await GpuModelRunner.Create(M, device, model, program);
  const blocks = await GpuModelRunner.Create(M, device, model, program);
  const c = program.config;
  const timing = {};
  const attend_dispatches = {blocked: 0, per_token: 0};
  let checks = 0;
  const page_bytes = (runner) => JSON.parse(M.UTF8ToString(M._kvq_web_kv_page_layout(runner.kv, 0))).page_bytes;
  for (const format of formats) {
    const what = `${name} ${format} (resident vs streamed)`;
    stream.NewSequence(format, format, 0, kPage, {path: 'stream'});
    resident.NewSequence(format, format, 0, kPage);
    blocks.NewSequence(format, format, 0, kPage);
    if (stream.path !== 'stream' || resident.path !== 'resident' || blocks.path !== 'resident') {
      fail(`${what}: paths ${stream.path} and ${resident.path} (${resident.path_why})`);
      continue;
    }
    const ids = prompt_ids.slice(0, kPositions);
    const written_before = resident.counts.write_backs, block_written_before = blocks.counts.write_backs;
    let ms_stream = 0, ms_resident = 0;
    const ends = new Map();  // the last position of each block -> the resident step's {token, logits} there
    for (let i = 0, end = -1; i < kBlocks.length; ++i) ends.set(end += kBlocks[i], null);
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
      if (ends.has(p)) ends.set(p, b);
      if (ids.length <= p + 1) ids.push(a.token);
      ++checks;
    }
    let first = 0;
    for (const [end, want] of ends) {
      if (!want) break;  // the token-by-token run stopped before it (its failure says why)
      const before = blocks.counts, attends_before = blocks.resident.counts.attend_dispatches;
      const capped = first === 0;  // the first call's blocks cut by uniform slots (kBlocks[0] = 5: 2, 2, 1)
      const got = await blocks.Prefill(ids.slice(first, end + 1),
                                       {logits: true, ...(capped ? {uniform_slots: 6 * c.n_layers} : {})});
      const after = blocks.counts;
      const counts = ['submits', 'readbacks', 'device_submits'].map((k) => after[k] - before[k]);
      // Attend dispatches: per block (capped: 2, 2, 1 tokens inside page 0) n_layers × the pages
      // up to its last position; per-token attention: n_layers × each position's pages.
      const pages = (position) => Math.floor(position / kPage) + 1;
      const want_attends = c.n_layers * (capped ? 3 * pages(end) : pages(end));
      const attends = blocks.resident.counts.attend_dispatches - attends_before;
      if (attends !== want_attends) {
        fail(`${what}: the prefill call of positions ${first}-${end} took ${attends} attend dispatches (expected ` +
             `${want_attends}: one per layer and page per block)`);
      }
      attend_dispatches.blocked += attends;
      for (let q = first; q <= end; ++q) attend_dispatches.per_token += c.n_layers * pages(q);
      const expected = capped ? '3,3,0' : '1,1,0';
      if (counts.join() !== expected) {
        fail(`${what}: the prefill call of positions ${first}-${end} took ${counts.join(', ')} submits, readbacks ` +
             `and KV device submits (expected ${expected.split(',').join(', ')})`);
      }
      const at = got.logits.findIndex((v, i) => !Object.is(v, want.logits[i]));
      if (at >= 0 || got.token !== want.token) {
        fail(`${what}: after the prefill block of positions ${first}-${end}, logit ${at} is ${got.logits[at]}, ` +
             `token by token ${want.logits[at]} (ids ${got.token}, ${want.token})`);
      }
      ++checks;
      first = end + 1;
    }
    timing[format] = {stream_ms: +(ms_stream / kPositions).toFixed(2), resident_ms: +(ms_resident / kPositions).toFixed(2)};
    await resident.Drain();
    await blocks.Drain();
    const full = Math.floor(kPositions / kPage);
    const written = resident.counts.write_backs - written_before;
    if (written !== full * c.n_layers) {
      fail(`${what}: ${written} pages written behind, the run filled ${full * c.n_layers}`);
    }
    const block_written = blocks.counts.write_backs - block_written_before;
    if (block_written !== full * c.n_layers) {
      fail(`${what}: the block run wrote ${block_written} pages behind, it filled ${full * c.n_layers}`);
    }
    const bytes = page_bytes(stream);
    const a = M._malloc(bytes), b = M._malloc(bytes);
    for (const [run, name] of [[resident, 'resident'], [blocks, 'block-prefilled']]) {
      for (let layer = 0; layer < c.n_layers; ++layer) {
        const held = M._kvq_web_kv_positions(run.kv, layer);
        if (held !== full * kPage) {
          fail(`${what}: the ${name} run's layer ${layer} master holds ${held} positions, expected ${full * kPage}`);
        }
        for (let page = 0; page < full; ++page) {
          if (M._kvq_web_kv_read_page(stream.kv, layer, page, a) !== 0 ||
              M._kvq_web_kv_read_page(run.kv, layer, page, b) !== 0) {
            fail(`${what}: read_page ${layer}/${page}: ${M.UTF8ToString(M._kvq_web_last_error())}`);
            continue;
          }
          const x = M.HEAPU8.subarray(a, a + bytes), y = M.HEAPU8.subarray(b, b + bytes);
          const at = x.findIndex((v, i) => v !== y[i]);
          if (at >= 0) {
            fail(`${what}: the ${name} run's layer ${layer} page ${page}: master byte ${at} is ${y[at]}, streamed ${x[at]}`);
          }
          ++checks;
        }
      }
    }
    M._free(a);
    M._free(b);
  }
  stream.Destroy();
  resident.Destroy();
  blocks.Destroy();
  return {checks, timing, attend_dispatches};
}
