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
// run's bit for bit (every matvec a block matmul, K and V encoded a page at a time, attention
// query-blocked: the per-token arithmetic), and its master pages equal the streamed run's byte
// for byte. The second call allows kCapSlots·n_cache_layers uniform slots (Prefill's uniform_slots): its
// 40 positions 5-44 would take 6 per layer (K and V calls in 2 pages, 1 attend, a gather), so the
// runner cuts the block at the page end, 5-31 (4) and 32-44 (4): kRunnerBlocks.
// Counted exactly per call (kv_resident.js's and block_steps.js's counts): per block and layer one
// attend dispatch per pool segment's run of pages up to its last position (query-blocked: one
// here, the pages pooled, kv_resident_pool.js; sinkN / resN: RowsAttends, the pages holding
// sinks and the windows of f32 rows apart), one K and one V encoder call
// per page the block writes (with a scales pass for the int formats), the uniform slots those
// take (which the runner's BlockUniformSlots predicts); and per block one matmul dispatch per
// piece of each matvec before the last attention, one activation quantisation per such matvec of
// a quantising type, and the last token's matvecs after it (the classifier). Per-token steps take
// each of those per token (also returned, for printing).
// A format may be a spec with rot (FORMAT+rot: kv_resident.js rotates the rows on the GPU before
// encoding them, and the queries, and unrotates the output), or "KEY/VALUE" for different specs
// (e.g. int4+rot/int8: keys alone rotated): the same checks, the master pages against the
// streamed run's, whose rows the module rotated (hadamard.cc) — so the GPU's rotation is kvq's bit
// for bit — and per block and layer RotationSlots' head-op dispatches (and uniform slots) more.
// The per-token step time of each path is measured and returned for printing: under load on
// SwiftShader (a CPU emulation of a GPU) it shows dispatch overhead, not a claim.
// KIVI (K in groups of G = 32 rows, the newest group f32 residual rows until its last row): a
// block is recorded in pieces cut where a group completes (its queries must see the group encoded
// from there on, f32 before), so per piece and layer: a V encoder call per page it writes, a K
// call for the group its first position completes, an attend per page of encoded rows and one
// for the residual rows, and a gather; its prefill calls run uncapped (the runner's cut for a
// capped call is the one-row formats' case).
// A prerope key spec (FORMAT+prerope: the pages hold the keys before RoPE, roped as the attends
// read them, kv_resident_rope.js): the same checks, and every page on the GPU, the tail's
// included, equals the streamed run's master page byte for byte.
import {GpuModelRunner} from '/web/gpu/gpu_engine.js';
import {EncoderHasScales, kEncoderFormats, KeyRowsPerBlock} from '/web/gpu/kv_formats.js';
import {RotationSlots, SplitKvSpec} from '/web/gpu/kv_resident.js';
import {EncodedRowsAt, RowsAttends, RowsEncodes, RowsPieces, RowsSpecOf} from '/web/gpu/kv_resident_rows.js';
import {WeightBlock} from '/web/gpu/weight_types.js';

const kPage = 32;       // positions per page (the smallest the cache takes)
const kPositions = 72;  // two full pages and a partial tail
const kBlocks = [5, 40, 27];  // prefill calls over the kPositions: positions 0-4, 5-44, 45-71
const kCappedCall = 1;  // the call given (kCapSlots + the spec's RotationSlots) · n_cache_layers uniform slots
const kCapSlots = 5;
const kRunnerBlocks = [[5], [27, 13], [27]];  // the blocks the runner makes of each call
// KIVI and fp8-e4m3 (keys in groups of 32): [position, positions kept] after the runs (72 held): position 71's group is the residual
// one, so 71 are kept (its f32 rows still on the GPU); 40's group was encoded since, so the
// sequence goes back to its start, 32 (kv_resident.js's KeepablePositions). Then, over a device
// budget of half the context, the runner takes the mixed mode (web.gpu_kv_mixed checks its bits).
const kKiviKeeps = [[71, 71], [40, 32]];

// formats: the encoder formats to run (all of kEncoderFormats unless given).
// Returns {checks, timing: {format: {stream_ms, resident_ms}}, dispatches: {attend, encode, weight:
// {blocked, per_token}} (the block runs' prefill calls, summed over formats; weight: matmuls and
// matvecs)}; failures go to fail(what).
export async function CheckResidentPath(M, device, model, program, prompt_ids, name, fail, formats = kEncoderFormats) {
  const stream = await GpuModelRunner.Create(M, device, model, program);
  const resident = await GpuModelRunner.Create(M, device, model, program);
  const blocks = await GpuModelRunner.Create(M, device, model, program);
  const c = program.config;
  const timing = {};
  const dispatches = {attend: {blocked: 0, per_token: 0}, encode: {blocked: 0, per_token: 0},
                      weight: {blocked: 0, per_token: 0}};
  const pages = (position) => Math.floor(position / kPage) + 1;  // pages up to a position
  // The program's matvecs, as dispatches: a block's matmul pieces (the matvecs up to its last
  // attention), the quantising ones among those, and the pieces of the matvecs after it.
  const last_attention = program.ops.findLastIndex((op) => op.kind === 'attention' || op.state !== undefined);
  const matvec_pieces = {blocked: 0, quantized: 0, last_token: 0};
  program.ops.forEach((op, i) => {
    if (op.kind !== 'matvec') return;
    const n = blocks.step.pieces_of(op.w).length;
    if (i > last_attention) {
      matvec_pieces.last_token += n;
    } else {
      matvec_pieces.blocked += n;
      matvec_pieces.quantized += WeightBlock(program.tensors[op.w].type).quantized_activation ? 1 : 0;
    }
  });
  let checks = 0;
  const page_bytes = (runner) => JSON.parse(M.UTF8ToString(M._kvq_web_kv_page_layout(runner.kv, 0))).page_bytes;
  for (const format of formats) {
    const what = `${name} ${format} (resident vs streamed)`;
    const [key, value = key] = format.split('/');
    // Dispatches per K and per V encoder call; head ops per layer and block (rot specs).
    const [k_passes, v_passes] = [key, value].map((spec) => (EncoderHasScales(SplitKvSpec(spec).format) ? 2 : 1));
    const rotations = RotationSlots(key, value);
    const G = KeyRowsPerBlock(SplitKvSpec(key).format);
    const prerope = SplitKvSpec(key).transforms.includes('prerope');  // pages of keys before RoPE
    // sinkN / resN: {sinks, residual}; run long enough for a page of rows aged out of the residual
    // (kPositions, then a block of the rest).
    const rows = RowsSpecOf(key, value);
    const positions = rows ? Math.max(kPositions, rows.residual + 2 * kPage + 8) : kPositions;
    const block_calls = positions > kPositions ? [...kBlocks, positions - kPositions] : kBlocks;
    // Per layer, the pieces a block of positions a..z is recorded in: [first, last] (one unless G > 1).
    const Pieces = (a, z) => {
      if (rows) return RowsPieces(a, z - a + 1, kPage, [G, 1], rows).map(([p, m]) => [p, p + m - 1]);
      const out = [];
      for (let p = a; p <= z;) {
        let e = p;
        while (e < z && (e + 1) % G !== G - 1) ++e;
        out.push([p, G > 1 ? e : z]);
        p = (G > 1 ? e : z) + 1;
      }
      return out;
    };
    // A piece's attends (page windows; for G > 1 those of encoded rows and one of residual rows),
    // its K and V encoder calls, and its encoder dispatches.
    const PieceCounts = (a, z) => {
      if (rows) {  // kv_resident_rows.js's plan: what the recording must match
        const calls = RowsEncodes(a, z, kPage, [G, 1], rows);
        return {attends: RowsAttends(z, kPage, [G, 1], rows, {segment_pages: blocks.resident.segment_pages}).length, calls: calls.length,
                encodes: calls.reduce((sum, {w}) => sum + (w ? v_passes : k_passes), 0)};
      }
      const written = pages(z) - pages(a) + 1;
      const encoded_end = Math.floor((a + 1) / G) * G;
      // Pooled pages (kv_resident_pool.js): a window per segment's run of pages (these contexts: one).
      const windows = (n_pages) => Math.ceil(n_pages / blocks.resident.segment_pages);
      const attends = G === 1 ? windows(pages(z)) : windows(Math.ceil(Math.min(encoded_end, z + 1) / kPage)) + (z >= encoded_end ? 1 : 0);
      const k_calls = G === 1 ? written : (a % G === G - 1 ? 1 : 0);
      return {attends, calls: k_calls + written, encodes: k_calls * k_passes + written * v_passes};
    };
    stream.NewSequence(key, value, 0, kPage, {path: 'stream'});
    resident.NewSequence(key, value, 0, kPage);
    blocks.NewSequence(key, value, 0, kPage);
    if (stream.path !== 'stream' || resident.path !== 'resident' || blocks.path !== 'resident') {
      fail(`${what}: paths ${stream.path} and ${resident.path} (${resident.path_why})`);
      continue;
    }
    const ids = prompt_ids.slice(0, positions);
    const written_before = resident.counts.write_backs, block_written_before = blocks.counts.write_backs;
    let ms_stream = 0, ms_resident = 0;
    const ends = new Map();  // the last position of each block -> the resident step's {token, logits} there
    const kivi_refs = new Map();  // kKiviKeeps' positions -> the resident step's {token, logits} there
    for (let i = 0, end = -1; i < block_calls.length; ++i) ends.set(end += block_calls[i], null);
    for (let p = 0; p < positions; ++p) {
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
      if ((G > 1 || rows) && kKiviKeeps.some(([at]) => at === p)) kivi_refs.set(p, b);
      if (ids.length <= p + 1) ids.push(a.token);
      ++checks;
    }
    let first = 0, call = 0;
    for (const [end, want] of ends) {
      if (!want) break;  // the token-by-token run stopped before it (its failure says why)
      const capped = call === kCappedCall && G === 1 && !rows;
      const before = blocks.counts, resident_before = {...blocks.resident.counts}, weights_before = {...blocks.step.block.counts};
      const slots_before = blocks.resident.uniforms.taken;
      const got = await blocks.Prefill(ids.slice(first, end + 1),
                                       {logits: true, ...(capped ? {uniform_slots: (kCapSlots + rotations) * c.n_cache_layers} : {})});
      const after = blocks.counts;
      const counts = ['submits', 'readbacks', 'device_submits'].map((k) => after[k] - before[k]);
      const want_blocks = G === 1 && !rows ? kRunnerBlocks[call] : [block_calls[call]];
      const expected = `${want_blocks.length},${want_blocks.length},0`;
      const call_what = `${what}: the prefill call of positions ${first}-${end}`;
      if (counts.join() !== expected) {
        fail(`${call_what} took ${counts.join(', ')} submits, readbacks and KV device submits (expected ` +
             `${expected.split(',').join(', ')}: blocks of ${want_blocks.join(', ')})`);
      }
      // Per block of positions a..z, per layer: the attends (a page window each up to z), the
      // encoder dispatches (K and V, one call per page the block writes, each with a scales pass
      // for the int formats), the uniform slots (those calls, the attends and a gather); and the
      // weight dispatches of the program (matvec_pieces). Per-token steps take those per token.
      const want_counts = {attends: 0, encodes: 0, head_ops: 0, slots: 0, matmuls: 0, quantizes: 0, matvecs: 0};
      for (let a = first, k = 0; k < want_blocks.length; a += want_blocks[k++]) {
        for (const [pa, pz] of Pieces(a, a + want_blocks[k] - 1)) {
          const {attends, calls, encodes} = PieceCounts(pa, pz);
          want_counts.attends += c.n_cache_layers * attends;
          want_counts.encodes += c.n_cache_layers * encodes;
          want_counts.head_ops += c.n_cache_layers * rotations;
          want_counts.slots += c.n_cache_layers * (calls + attends + 1 + rotations);
        }
        want_counts.matmuls += matvec_pieces.blocked;
        want_counts.quantizes += matvec_pieces.quantized;
        want_counts.matvecs += matvec_pieces.last_token;
      }
      const rc = blocks.resident.counts, wc = blocks.step.block.counts;
      const got_counts = {attends: rc.attend_dispatches - resident_before.attend_dispatches,
                          encodes: rc.encode_dispatches - resident_before.encode_dispatches,
                          head_ops: rc.head_op_dispatches - resident_before.head_op_dispatches,
                          slots: blocks.resident.uniforms.taken - slots_before,
                          matmuls: wc.matmul_dispatches - weights_before.matmul_dispatches,
                          quantizes: wc.quantize_dispatches - weights_before.quantize_dispatches,
                          matvecs: wc.matvec_dispatches - weights_before.matvec_dispatches};
      if (JSON.stringify(got_counts) !== JSON.stringify(want_counts)) {
        fail(`${call_what} (blocks of ${want_blocks.join(', ')}) took ${JSON.stringify(got_counts)} attend, KV encoder ` +
             `and weight dispatches and uniform slots, expected ${JSON.stringify(want_counts)}`);
      }
      const tokens = end - first + 1;
      dispatches.attend.blocked += got_counts.attends;
      dispatches.encode.blocked += got_counts.encodes;
      dispatches.weight.blocked += got_counts.matmuls + got_counts.matvecs;
      for (let q = first; q <= end; ++q) {
        const {attends, encodes} = PieceCounts(q, q);
        dispatches.attend.per_token += c.n_cache_layers * attends;
        dispatches.encode.per_token += c.n_cache_layers * encodes;
      }
      dispatches.weight.per_token += (matvec_pieces.blocked + matvec_pieces.last_token) * tokens;
      const at = got.logits.findIndex((v, i) => !Object.is(v, want.logits[i]));
      if (at >= 0 || got.token !== want.token) {
        fail(`${what}: after the prefill block of positions ${first}-${end}, logit ${at} is ${got.logits[at]}, ` +
             `token by token ${want.logits[at]} (ids ${got.token}, ${want.token})`);
      }
      ++checks;
      first = end + 1;
      ++call;
    }
    timing[format] = {stream_ms: +(ms_stream / positions).toFixed(2), resident_ms: +(ms_resident / positions).toFixed(2)};
    await resident.Drain();
    await blocks.Drain();
    const full = Math.floor(positions / kPage);
    // sinkN / resN: the master was given whole pages' rows (full · kPage), so it holds in blocks only
    // the pages whose rows aged out there; the streamed run's master holds those the same.
    const encoded_pages = rows ? Math.floor(Math.min(EncodedRowsAt(full * kPage, G, rows.residual),
                                                     EncodedRowsAt(full * kPage, 1, rows.residual)) / kPage) : full;
    const written = resident.counts.write_backs - written_before;
    if (written !== full * c.n_cache_layers) {
      fail(`${what}: ${written} pages written behind, the run filled ${full * c.n_cache_layers}`);
    }
    const block_written = blocks.counts.write_backs - block_written_before;
    if (block_written !== full * c.n_cache_layers) {
      fail(`${what}: the block run wrote ${block_written} pages behind, it filled ${full * c.n_cache_layers}`);
    }
    const bytes = page_bytes(stream);
    const a = M._malloc(bytes), b = M._malloc(bytes);
    for (const [run, name] of [[resident, 'resident'], [blocks, 'block-prefilled']]) {
      for (let layer = 0; layer < c.n_cache_layers; ++layer) {
        const held = M._kvq_web_kv_positions(run.kv, layer);
        if (held !== full * kPage) {
          fail(`${what}: the ${name} run's layer ${layer} master holds ${held} positions, expected ${full * kPage}`);
        }
        for (let page = 0; page < encoded_pages; ++page) {
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
    // sinkN / resN: every page on the GPU (encoded there as rows aged out, sink slots stand-ins)
    // equals the streamed run's master page at the same length byte for byte; so with prerope
    // (the keys encoded before RoPE on both sides), the tail page included.
    for (let layer = 0; (rows || prerope) && layer < c.n_cache_layers; ++layer) {
      const gpu_pages = resident.resident.layers[layer].pages;
      for (let page = 0; page < Math.ceil(positions / kPage); ++page) {
        const staging = device.createBuffer({size: Math.ceil(bytes / 4) * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
        const encoder = device.createCommandEncoder();
        encoder.copyBufferToBuffer(gpu_pages[page].buffer, gpu_pages[page].offset, staging, 0, staging.size);  // pooled: at its offset
        device.queue.submit([encoder.finish()]);
        await staging.mapAsync(GPUMapMode.READ);
        const y = new Uint8Array(staging.getMappedRange(), 0, bytes);
        // A page with no row encoded yet the master may not have made: zeros then (so is the GPU's).
        if (M._kvq_web_kv_read_page(stream.kv, layer, page, a) !== 0) {
          const error = M.UTF8ToString(M._kvq_web_last_error());
          if (!error.includes('never written')) fail(`${what}: read_page ${layer}/${page}: ${error}`);
          M.HEAPU8.fill(0, a, a + bytes);
        }
        const x = M.HEAPU8.subarray(a, a + bytes), at = x.findIndex((v, i) => v !== y[i]);
        if (at >= 0) fail(`${what}: the GPU's layer ${layer} page ${page}: byte ${at} is ${y[at]}, the streamed master's ${x[at]}`);
        staging.destroy();
        ++checks;
      }
    }
    M._free(a);
    M._free(b);
    // KIVI: the block run's sequence kept up to a position (KeepPrefix, a chat's next turn) and
    // the rest run again: the logits there equal the token-by-token run's bit for bit.
    // sinkN / resN: rows encoded since cannot be f32 again (kvq's TruncationPoint 0): from 0.
    for (const [at, kivi_kept] of G > 1 || rows ? kKiviKeeps : []) {
      const want = kivi_refs.get(at), kept = await blocks.KeepPrefix(ids.slice(0, at + 1)), want_kept = rows ? 0 : kivi_kept;
      if (kept !== want_kept || !want) {
        fail(`${what}: kept ${kept} positions for a prompt of ${at + 1} (expected ${want_kept})`);
        continue;
      }
      const got = await blocks.Prefill(ids.slice(kept, at + 1), {logits: true});
      const i = got.logits.findIndex((v, j) => !Object.is(v, want.logits[j]));
      if (i >= 0 || got.token !== want.token) {
        fail(`${what}: kept ${kept} positions and ran to ${at}: logit ${i} is ${got.logits[i]}, token by token ` +
             `${want.logits[i]} (ids ${got.token}, ${want.token})`);
      }
      ++checks;
    }
    // Over the device budget (half the context): KIVI and prerope keys take the mixed mode
    // (web.gpu_kv_mixed checks its bits); sinkN / resN specs do where the budget holds their f32
    // rows (each layer's ring) and the pages the master has not all encoded, else streamed saying
    // so (on this small context they outweigh half of it).
    if (G > 1 || rows || prerope) {
      const plan = blocks.NewSequence(format, format, 0, kPage);
      blocks.NewSequence(format, format, Math.floor(plan.total_bytes / 2), kPage);
      const small = rows && blocks.path === 'stream' && /holds less than .* per layer/.test(blocks.path_why);
      if (!small && blocks.path !== 'mixed') {
        fail(`${what}: over the device budget the ${blocks.path} path (${blocks.path_why}), expected mixed`);
      }
      ++checks;
    }
  }
  stream.Destroy();
  resident.Destroy();
  blocks.Destroy();
  return {checks, timing, dispatches};
}
