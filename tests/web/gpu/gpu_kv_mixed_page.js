// In the page: the GPU path's mixed KV mode (web/gpu/kv_resident.js) on a context 8× the device
// budget. The model is the Bonsai-shaped qwen3 Q1_0 synth with a context of 512 positions
// (gpu_forward_fixture's manifest "mixed": 2 layers, 2 KV heads × 64); pages of 32 positions, so
// 16 pages per layer, 32 in all. The budget is kMinStreamSlots streaming slots plus one resident page
// per layer: 4 page buffers, so the 512 positions run hold 8× the budget (asserted from the plan;
// 2× for the specs below, whose rows beside the pages are much of this small model's budget);
// plus what a spec keeps beside its pages (BudgetOf, counted here from the page layout and the
// config, not asked of kv_resident_specs.js's MixedCosts: a cost it forgets keeps more pages
// resident than the one asserted, or makes its GPU bytes differ from the budget): keys in groups
// (KIVI, fp8-e4m3) each layer's f32 newest group, prerope keys a page of cos/sin rows per slot
// and the ring's page per resident page (kv_resident_rope.js), sinkN / resN specs their f32 rows
// and more resident pages (kRowsSpecs).
// Per KV format the mixed mode takes (kMixedFormats: kv_formats.js's encoder registry, the
// grouped keys' included; `only`, given as "RUN:LIST" with LIST the formats the ctest runs, which
// must be the registry's, and RUN a comma-separated subset of them or of the specs below, or
// empty for all: the formats share this page, its module, model and runners), kRotSpecs (a rot
// spec: rows, queries and output rotated on the GPU, the streamed run's rows rotated by the
// module, so its master pages check the GPU's rotation bit for bit) and kPreropeSpecs (keys
// stored before RoPE and roped as the attends read them, a streamed page by the cos/sin rows in
// its slot, a resident one by the ring's; the master pages hold the keys before RoPE) and kRowsSpecs
// (sinkN / resN: f32 sinks and residual rows, pages written behind as rows), the same ids
// (the q1_0 model's first prompt, then the whole-context run's greedy ids) run on three runners —
// the whole 512-position context for kFullFormat, kShortPositions or kRunPositions for the others (below):
//   - whole: a budget of exactly the bytes the resident path needs for the context (the engine's
//     resident_bytes: path 'resident', every page stays on the GPU; a byte less takes the mixed
//     path); its GPU KV bytes must peak at or under that budget, checked after the run (pools
//     made at full size, where doubling held an outgrown buffer beside each new one);
//   - stream: path 'stream' (rows read back into the master each layer, pages through kv_device.js);
//   - mixed: the budget above (path 'mixed': the tail page per layer resident, older ones evicted
//     and streamed from the master).
// Checked at every position: the mixed step's id equals both others' and its logits equal theirs
// bit for bit (Object.is: the same windows of the same kernels in the same order); counted by the
// resident cache and the step program: 1 readback; no KV device submit; streamed bytes equal the
// evicted pages' bytes — n_layers × (the pages before the position's own) × page_bytes, resident
// pages never uploaded again (prerope: a page of cos/sin rows with each); submits 1 + one each
// time the S streaming slots are all written and another page comes (⌈W / S⌉ for W ≥ 1 pages
// streamed in the step, the layers' in turn; S = kMinStreamSlots, the mixed mode's choice for these
// small budgets, asserted, or NAME@R/S's); for a format of one row per block without sinkN / resN,
// attend dispatches per layer: one per run of its evicted pages in consecutive slots (the slots
// taken in turn from the layer before's, a run cut where they are all written) and one per run of
// the resident pages in their ring (two where it wraps: kWideSpecs); the whole run streams nothing
// and submits once. After the run: the mixed cache's GPU KV bytes peaked
// at the budget exactly (every buffer it holds counted, none forgotten by the budget), and its
// master pages (written behind) equal the streamed run's byte for byte.
// A fourth runner on the same budget prefills the first kBlockPositions ids in calls of kBlockCall
// (GpuModelRunner.Prefill, which cuts its blocks at every page boundary here: one resident page
// per layer, so a new page evicts one): after each call its logits equal the mixed token-by-token
// step's bit for bit; counted per call: readbacks = the blocks (the pages the call touches),
// streamed bytes = the evicted pages' once per block (attention is query-blocked: each streamed
// window serves all the block's queries; token by token it was once per token) — keys in groups
// of G: once per piece of it, a block being cut where a group completes (a query reads the group
// f32 before, encoded from there), so a block ending a page streams twice —, submits ≤ blocks
// + ⌊W / S⌋ with W the pages streamed (the slots all written, so submitted first, at most every S
// pages).
import {GpuModelRunner, GpuProgramOf} from '/web/gpu/gpu_engine.js';
import {kEncoderFormats, kGroupKeyEncoderFormats, KeyRowsPerBlock} from '/web/gpu/kv_formats.js';
import {kMinStreamSlots, PageBufferBytes, SplitKvSpec} from '/web/gpu/kv_resident.js';
import {LoadModule} from '/test/gpu_kv_device_page.js';
import {LoadModel} from '/test/gpu_device_loss_page.js';

const kPage = 32;
// The format run over the whole context (8× the budget): f32, the largest pages, so the largest
// offsets and the most bytes streamed. The others run kShortPositions (kRunPositions: fewer for
// the specs that keep rows beside their pages): 5 pages per layer, which
// still crosses every boundary the mixed mode has — each page boundary evicts (4 evictions per
// layer), a step streams up to 8 pages through 2 streaming slots (the slots of every spec but
// kWideSpecs' NAME@R/S; each slot reused, up to 4 submits), and the block runner's kBlockPositions lie inside it with an evicted page streamed in
// every block from the second page on. What only a longer run reaches (more windows per step, the
// plan's 8×) is format-independent, and checked on kFullFormat.
const kFullFormat = 'f32';
const kShortPositions = 160;
const kBlockPositions = 128;  // four pages: the block runner streams evicted pages from the second on
const kBlockCall = 24;        // ids per Prefill call (its blocks cross no page boundary)
// After its calls the block runner keeps the sequence up to this position (KeepPrefix, a chat's
// next turn) and runs it again: its logits equal the token-by-token step's there. Position 40 is
// in page 1, evicted once the runner held a third page (brought back from the master: Truncate);
// with keys in groups of 32 its group is encoded since then, so the runner keeps 32, or, when
// its group is still the f32 one (48 held), keeps 40 and runs the residual rows again.
const kKeepAt = 40;
// Specs with the rot transform, run after the registry's formats (and by name in RUN). int4+rot's
// position 90 has a rotated K head whose max|x| / 7 is an f16 rounding tie: the encoders' division
// must be correctly rounded there (div_rn.js; WGSL's '/' on SwiftShader once rounded it up).
const kRotSpecs = ['int4+rot'];
// The formats the mixed mode takes: every one with a GPU encoder, keys in groups included.
const kMixedFormats = [...kEncoderFormats, ...kGroupKeyEncoderFormats];
// Specs with prerope keys: KIVI's (groups, their f32 residual, and the cos/sin) and one of a row
// per block (int8's).
const kPreropeSpecs = ['int4-kivi+prerope', 'int8+prerope'];
// The positions the specs that keep rows beside their pages run (the suite's time: each costs more
// than a format's kShortPositions), the others kShortPositions. int4-kivi (README's command 1)
// and int4-kivi+prerope: four pages, still every boundary (3 evictions per layer, up to 6 pages
// streamed a step, each slot reused; the block runner's kBlockPositions). int2-kivi and fp8-e4m3:
// two pages, a page evicted and streamed in every step of the second, so their master bytes are
// read through a slot (the group logic is the same, 32 rows for all, and runs over int4-kivi's).
// int8+prerope: two as well (the cos/sin ring, a page with one resident page, wraps at each).
// sinkN / resN specs (kv_resident_rows.js; the mixed mode keeps resident the pages whose rows
// the master has not all encoded: {spec: resident pages per layer}). int4-kivi+sink4+res64: the
// master encodes a row 64 positions after it, so a page is evicted once the two after it are
// written behind: 3 resident pages; over 128 positions page 0, its sinks beside its bytes, is
// streamed in every step of the fourth page (its sinks from the slot), the 64 residual rows cross
// two page boundaries, and the block runner's blocks are cut at every position from 64 on (a row
// ages out at each). int8+sink4+res32: 2 resident pages; over 96 positions page 0 and its sinks are
// streamed in the third page. int4+sink4 (sinks alone: a page's rows encoded as they come, the
// sinks' slots from zeros): 1 resident page; over 64 positions page 0 and its sinks are streamed
// in the second. int4-kivi+prerope+sink4+res16: 2 resident pages (and their cos/sin rows in the
// ring); over 96 positions page 0 is streamed in the third, its cos/sin rows and sinks in its slot.
// int4+sink40: more sinks than a page holds (pages 0 and 1 carry 32 and 8): 1 resident page; over
// 96 positions page 0 with its 32 sinks is streamed from the second page on and page 1 with its 8
// from the third (the budget reserves all 40 per layer; at most one page's 32 are held at once).
// int8+res32 (no sinks: the resident pages in a ring of 2 slots, kv_resident_pool.js): 2 resident
// pages; over 96 positions page 2 takes page 0's slot while its rows age out of the f32 ring into
// page 1, and page 0 is streamed in the third.
const kRowsSpecs = {'int4+sink40': 1, 'int4-kivi+sink4+res64': 3, 'int8+sink4+res32': 2, 'int4+sink4': 1, 'int4-kivi+prerope+sink4+res16': 2,
                    'int8+res32': 2};
// Specs run with more resident pages than the budget's least (NAME@R: the spec NAME, R resident
// pages per layer): the resident pages lie in a ring of R slots (kv_resident_pool.js), a run of
// them one attend window, two where the ring wraps. int8@3 over 160 positions: 5 pages per layer,
// the ring wrapped at pages 3 and 4, pages 0 and 1 evicted and streamed. int8+prerope@3: the same
// with keys roped as they are read, a joined window's cos/sin rows from the rope ring
// (kv_resident_rope.js), which wraps where the pages' ring does. int4-kivi@3: keys in groups of
// 32, a page's encoded groups joined with the pages before it, the residual group a window apart.
// NAME@R/S: S streaming slots (the runner's stream_slots), so a run of a layer's evicted pages in
// consecutive slots is one window: int8@1/5 streams up to 8 pages a step through 5 slots (layer 1's
// run cut where the slots wrap), int8+prerope@1/3 with a streamed run's cos/sin rows side by side
// in the slots' rope buffer, int4-kivi@1/4 KIVI pages of whole groups joined.
const kWideSpecs = {'int8@3': 3, 'int8+prerope@3': 3, 'int4-kivi@3': 3, 'int8@1/5': 1, 'int8+prerope@1/3': 1, 'int4-kivi@1/4': 1};
// NAME@R/S's S, else the mixed mode's own choice for these budgets.
const SlotsOf = (format) => Number(/@\d+\/(\d+)$/.exec(format)?.[1] ?? kMinStreamSlots);
const kRunPositions = {'int4-kivi': 128, 'int4-kivi+prerope': 128, 'int2-kivi': 64, 'fp8-e4m3': 64, 'int8+prerope': 64,
                       'int4+sink40': 96, 'int4-kivi+sink4+res64': 128, 'int8+sink4+res32': 96, 'int4+sink4': 64, 'int4-kivi+prerope+sink4+res16': 96,
                       'int8+res32': 96};
// The {sinks, residual} rows of a spec's sinkN / resN (0 without).
const RowsOf = (spec) => Object.fromEntries([['sinks', /^sink(\d+)$/], ['residual', /^res(\d+)$/]].map(([k, re]) =>
  [k, Number(SplitKvSpec(spec).transforms.map((t) => re.exec(t)?.[1]).find((x) => x) ?? 0)]));

// The device budget of the spec's mixed run: S streaming slots and R resident pages per layer
// (page buffers of `unit` bytes; R = 1, kRowsSpecs' for sinkN / resN, kWideSpecs'), and what the
// spec keeps beside them. {budget, rope_page: a page's cos/sin rows' bytes (0 without prerope)}.
function BudgetOf(spec, c, unit, R, S) {
  const G = KeyRowsPerBlock(SplitKvSpec(spec).format), {sinks, residual: res} = RowsOf(spec), rows = sinks || res;
  const row = c.kv_dim * 4;  // one position's K (or V) row, [kv_dim] f32
  const residual = G > 1 && !rows ? G * row : 0;  // a layer's [G][kv_dim] f32 newest group (sinkN / resN: in the ring)
  const rope_page = SplitKvSpec(spec).transforms.includes('prerope') ? kPage * c.rotary_dims * 4 : 0;  // [P][rotary_dims] f32
  // sinkN / resN: a slot holds a streamed page's sinks after its bytes ([2][its sinks][kv_dim]: at
  // most a page's, page 0's), a layer its sinks beside its pages and a ring of f32 K and V rows
  // ([2][ring][kv_dim], ring: whole pages, a page more than res + G − 1), the cache one row of
  // zeros and an encoder scratch of a page's rows.
  const slot_sinks = 2 * Math.min(sinks, kPage) * row, ring = kPage * (Math.ceil((res + G - 1) / kPage) + 1);
  const layer_rows = rows ? 2 * sinks * row + 2 * ring * row : 0, once = rows ? row + kPage * row : 0;
  return {budget: S * (unit + rope_page + slot_sinks) + c.n_layers * (R * unit + residual + layer_rows) +
                  R * rope_page + once, rope_page};
}

// Returns {formats, positions, checks, streamed_bytes, submits, ratio, failures, seconds, per_format:
// {format: {positions, checks, failures, seconds}}}; each failure names its format.
export async function RunGpuKvMixedTests(fixture_url, bundle_url, only = '') {
  const t0 = performance.now();
  const failures = [];
  const fail = (what) => failures.push(what);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], positions: 0};
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {failures: ['no WebGPU adapter'], positions: 0};
  const device = await adapter.requestDevice();
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const M = await LoadModule(bundle_url);
  const manifest = await (await fetch(`${fixture_url}/manifest.json`)).json();
  const origin = new URL(fixture_url).origin;
  if (!manifest.mixed || !manifest.mixed_rows) return {failures: ['the manifest names no "mixed" or "mixed_rows" model (gpu_forward_fixture)'], positions: 0};
  const model = await LoadModel(M, origin + manifest.mixed, '');
  const {program, why_not} = GpuProgramOf(M, model);
  if (!program) return {failures: [`the GPU path refused the mixed-mode model: ${why_not}`], positions: 0};
  const c = program.config;
  const prompt_run = manifest.models.find((m) => m.name === 'qwen3-q1_0')?.runs[0];
  if (!prompt_run) return {failures: ['no qwen3-q1_0 run in the manifest for a prompt'], positions: 0};
  const [subset, list] = only.split(':');
  if (list !== undefined && list !== kMixedFormats.join(',')) {
    fail(`the test runs formats ${list}; the mixed mode takes ${kMixedFormats.join(',')}`);
  }
  const wanted = subset ? subset.split(',') : [];
  const known = [...kMixedFormats, ...kRotSpecs, ...kPreropeSpecs, ...Object.keys(kRowsSpecs), ...Object.keys(kWideSpecs)];
  for (const f of wanted) if (!known.includes(f)) fail(`no encoder format, rot, prerope or sinkN / resN spec "${f}" (${known.join(', ')})`);
  const formats = known.filter((f) => !wanted.length || wanted.includes(f));
  const Runners = async (m, p) => Promise.all([0, 1, 2, 3].map(() => GpuModelRunner.Create(M, device, m, p)));
  const [whole_512, stream_512, mixed_512, blocks_512] = await Runners(model, program);
  const [whole, stream, mixed, blocks] = [whole_512, stream_512, mixed_512, blocks_512];
  // kRowsSpecs run on the model again with a context of 2048 (manifest "mixed_rows"): their f32
  // rows on the GPU outweigh the 512-position context's KV (no budget under it holds them).
  const rows_wanted = formats.some((f) => kRowsSpecs[f]);
  const rows_model = rows_wanted ? await LoadModel(M, origin + manifest.mixed_rows, '') : 0;
  const rows_program = rows_wanted ? GpuProgramOf(M, rows_model).program : null;
  if (rows_wanted && !rows_program) return {failures: ['the GPU path refused the "mixed_rows" model'], positions: 0};
  const rows_runners = rows_wanted ? await Runners(rows_model, rows_program) : null;
  // The four runners on one device compile the step program's WGSL once (web/gpu/pipeline_cache.js):
  // every pipeline of the later ones is the first one's object. {ops, hybrid, moe}: {entry:
  // pipeline}; weight_ops: {type/layout: {entry: pipeline}}.
  const Flat = (p) => Object.entries(p).flatMap(([group, g]) => Object.entries(g).flatMap(([k, x]) =>
      group === 'weight_ops' ? Object.entries(x).map(([e, y]) => [`${group} ${k} ${e}`, y]) : [[`${group} ${k}`, x]]));
  const first = Flat(whole.step.pipelines);
  for (const [name, r] of [['stream', stream], ['mixed', mixed], ['blocks', blocks]]) {
    const theirs = new Map(Flat(r.step.pipelines));
    for (const [what, pipeline] of first) {
      if (theirs.get(what) !== pipeline) fail(`the ${name} runner has its own ${what} pipeline (not the device's shared one)`);
    }
    if (theirs.size !== first.length || !first.length) fail(`the ${name} runner has ${theirs.size} pipelines, the first ${first.length}`);
  }
  let positions = 0, checks = 0, streamed = 0, submits = 0, ratio = 0;
  const per_format = {};
  for (const format of formats) {
    const f0 = {positions, checks, failures: failures.length, t: performance.now()};
    const spec = format.replace(/@\d+(\/\d+)?$/, '');  // kWideSpecs' NAME@R[/S]: the spec NAME
    const [whole, stream, mixed, blocks] = kRowsSpecs[format] ? rows_runners : [whole_512, stream_512, mixed_512, blocks_512];
    const what = `${format} (mixed vs whole-context resident and streamed)`;
    whole.NewSequence(spec, spec, 0, kPage);
    const whole_budget = whole.resident_bytes;  // what the resident path needs for the context
    whole.NewSequence(spec, spec, whole_budget - 1, kPage);
    if (whole.path !== 'mixed') fail(`${format}: a budget of ${whole_budget - 1} bytes takes the ${whole.path} path, not mixed`);
    whole.NewSequence(spec, spec, whole_budget, kPage);
    stream.NewSequence(spec, spec, 0, kPage, {path: 'stream'});
    const page_bytes = whole.layout.page_bytes, unit = PageBufferBytes(page_bytes);
    const R = kRowsSpecs[format] ?? kWideSpecs[format] ?? 1;  // resident pages per layer
    const S = SlotsOf(format), slots = /\/\d+$/.test(format) ? {stream_slots: S} : {};  // streaming slots
    const {budget, rope_page} = BudgetOf(spec, c, unit, R, S);
    const plan = mixed.NewSequence(spec, spec, budget, kPage, slots);
    if (kRowsSpecs[format]) {  // a byte less holds a page fewer per layer: too few for the rows (streamed)
      blocks.NewSequence(spec, spec, budget - 1, kPage, slots);
      if (blocks.path !== 'stream' || !new RegExp(`holds less than .* ${kRowsSpecs[format]} pages? per layer`).test(blocks.path_why)) {
        fail(`${format}: a budget of ${budget - 1} bytes takes the ${blocks.path} path (${blocks.path_why}), not the stream path`);
      }
    }
    blocks.NewSequence(spec, spec, budget, kPage, slots);
    let block_from = 0;  // the block runner's next position
    let keep_ref = null;  // the mixed step's {token, logits} at kKeepAt
    const context = JSON.parse(M.UTF8ToString(M._kvq_web_model_info(kRowsSpecs[format] ? rows_model : model))).context;
    const G = KeyRowsPerBlock(SplitKvSpec(spec).format);  // K rows per block: 32 for keys in groups
    const beside = G > 1 || rope_page > 0;  // rows kept beside the pages
    const run = format === kFullFormat ? context : kRunPositions[format] ?? kShortPositions;
    const {sinks, residual: res} = RowsOf(spec);
    const Evicted = (q) => Math.max(0, Math.floor(q / kPage) + 1 - R);  // pages evicted at position q
    if (whole.path !== 'resident' || stream.path !== 'stream' || mixed.path !== 'mixed' || mixed.resident_pages !== R ||
        mixed.stream_slots !== S || blocks.stream_slots !== S) {
      fail(`${what}: paths ${whole.path}, ${stream.path}, ${mixed.path} with ${mixed.resident_pages} resident pages and ` +
           `${mixed.stream_slots} streaming slots (blocks: ${blocks.stream_slots}; expected ${R} and ${S}) ` +
           `(${mixed.path_why}; budget ${budget} bytes, plan ${plan.total_bytes})`);
      continue;
    }
    // The run's KV as the cache plans it (the model's whole context) over the budget (a spec's f32
    // rows and cos/sin beside the pages are a large part of it on this small model: 2× there).
    ratio = plan.total_bytes / budget;
    const least = beside || kRowsSpecs[format] || S !== kMinStreamSlots ? 2 : 8 / R;
    if (context !== (kRowsSpecs[format] ? 2048 : 512) || !(ratio >= least)) {
      fail(`${what}: the plan of the ${context}-position context holds ${ratio}× the budget of ${budget} bytes, not ${least}× (plan ` +
           `${plan.total_bytes} bytes)`);
    }
    const ids = prompt_run.ids.slice(0, prompt_run.n_prompt);
    let release = null;  // opens the last mixed step's write-behinds (kRowsSpecs)
    for (let p = 0; p < run; ++p) {
      const w0 = whole.counts;
      const a = await whole.Step(ids[p], {logits: true});
      const w1 = whole.counts;
      const b = await stream.Step(ids[p], {logits: true});
      const Counts = () => ({...mixed.counts, rope_bytes: mixed.resident.counts.streamed_rope_bytes,
                             sink_bytes: mixed.resident.counts.streamed_sink_bytes,
                             attends: mixed.resident.counts.attend_dispatches});
      const before = Counts();
      // sinkN / resN: each step's write-behinds held back until the next step has started (a map
      // that lands late), so a step that evicts must wait for them itself (GpuResidentKv.WaitsFor:
      // the pages that leave the evicted ones' rows encoded in the master, not only those pages).
      if (release) setTimeout(release, 0);
      const running = mixed.Step(ids[p], {logits: true});
      if (kRowsSpecs[format]) {  // after the step's start (its Drain awaits the write-behinds queued before)
        const gate = new Promise((r) => { release = r; });
        mixed.resident.behind = mixed.resident.behind.then(() => gate);
      }
      const m = await running;
      const after = Counts();
      ++positions;
      if (p === kKeepAt) keep_ref = m;
      for (const [name, o] of [['whole-context resident', a], ['streamed', b]]) {
        const at = m.logits.findIndex((v, i) => !Object.is(v, o.logits[i]));
        if (at >= 0 || m.token !== o.token) {
          fail(`${what} position ${p}: logit ${at} is ${m.logits[at]}, the ${name} run's ${o.logits[at]} ` +
               `(ids ${m.token}, ${o.token})`);
        }
      }
      const windows = c.n_layers * Evicted(p);  // every page before the R newest
      const want = {readbacks: 1, device_submits: 0, streamed_bytes: windows * page_bytes, rope_bytes: windows * rope_page,
                    // each evicted page's sinks (page i: rows [iP, min(sinks, (i + 1)P))), per layer
                    sink_bytes: c.n_layers * 2 * c.kv_dim * 4 *
                                Array.from({length: Evicted(p)}, (_, i) => Math.min(kPage, Math.max(0, sinks - i * kPage)))
                                  .reduce((x, y) => x + y, 0),
                    submits: Math.max(1, Math.ceil(windows / S))};
      if (G === 1 && !sinks && !res) {  // attends a layer: one per run of streaming slots, one per run of the resident ring's slots
        const last = Math.floor(p / kPage), E = Evicted(p);
        let runs = 1;
        for (let i = E + 1; i <= last; ++i) if (i % R === 0) ++runs;  // the ring wraps before page i
        // Layer l's evicted pages take the step's slot uses l·E .. (l + 1)·E − 1, a run cut at each multiple of S.
        let streamed_runs = 0;
        for (let l = 0; E > 0 && l < c.n_layers; ++l) streamed_runs += Math.floor(((l + 1) * E - 1) / S) - Math.floor(l * E / S) + 1;
        want.attends = streamed_runs + c.n_layers * runs;
      }
      const got = {};
      for (const k of Object.keys(want)) got[k] = after[k] - before[k];
      if (Object.keys(want).some((k) => got[k] !== want[k])) {
        fail(`${what} position ${p}: ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
      }
      if (w1.submits - w0.submits !== 1 || w1.readbacks - w0.readbacks !== 1 || w1.streamed_bytes !== w0.streamed_bytes) {
        fail(`${what} position ${p}: the whole-context run took ${w1.submits - w0.submits} submits, ` +
             `${w1.readbacks - w0.readbacks} readbacks and streamed ${w1.streamed_bytes - w0.streamed_bytes} bytes`);
      }
      streamed += got.streamed_bytes;
      submits += got.submits;
      if (failures.length - f0.failures > 20) break;  // this format is broken: on to the next
      ++checks;
      if (ids.length <= p + 1) ids.push(a.token);
      if (p < kBlockPositions && ((p + 1) % kBlockCall === 0 || p + 1 === kBlockPositions)) {
        const b0 = blocks.counts;
        const got_block = await blocks.Prefill(ids.slice(block_from, p + 1), {logits: true});
        const b1 = blocks.counts;
        const at = got_block.logits.findIndex((v, i) => !Object.is(v, m.logits[i]));
        if (blocks.path !== 'mixed' || at >= 0 || got_block.token !== m.token) {
          fail(`${what} prefill of positions ${block_from}-${p} on the ${blocks.path} path: logit ${at} is ` +
               `${got_block.logits[at]}, token by token ${m.logits[at]} (ids ${got_block.token}, ${m.token})`);
        }
        // Per block (one per page the call touches), and per piece of it where K is in groups of G
        // (from each position completing a group; resN: each position from res, where a row ages
        // out): each layer's evicted pages.
        let windows = 0;
        for (let q = block_from; q <= p; ++q) {
          const cut = res ? q >= res : G > 1 && q % G === G - 1;
          if (q === block_from || q % kPage === 0 || cut) windows += c.n_layers * Evicted(q);
        }
        // Blocks: cut where a page starts that evicts one (FirstResident moves: every page with R = 1).
        let block_count = 1;
        for (let q = block_from + 1; q <= p; ++q) if (q % kPage === 0 && Evicted(q) > 0) ++block_count;
        const d = (k) => b1[k] - b0[k];
        if (d('readbacks') !== block_count || d('streamed_bytes') !== windows * page_bytes ||
            !(d('submits') >= block_count && d('submits') <= block_count + Math.floor(windows / S))) {
          fail(`${what} prefill of positions ${block_from}-${p}: ${d('readbacks')} readbacks, ${d('submits')} submits, ` +
               `${d('streamed_bytes')} bytes streamed; expected ${block_count} blocks, ≤ ${block_count} + ` +
               `${Math.floor(windows / S)} submits, ${windows * page_bytes} bytes`);
        }
        block_from = p + 1;
        ++checks;
      }
    }
    // The block runner's sequence cut back to kKeepAt (its positions before kept) and run again.
    const group_gone = G > 1 && kKeepAt % G !== 0 && Math.floor(kKeepAt / G) !== Math.floor((block_from - 1) / G);
    // sinkN / resN: rows encoded since cannot be f32 again (GpuResidentKv.KeepablePositions): from 0
    const want_kept = sinks || res ? 0 : group_gone ? Math.floor(kKeepAt / G) * G : kKeepAt;
    // (Only once the steps reached kKeepAt: a format that broke off before has failed already.)
    if (keep_ref) {
      const kept = await blocks.KeepPrefix(ids.slice(0, kKeepAt + 1));
      const again = kept === want_kept && await blocks.Prefill(ids.slice(kept, kKeepAt + 1), {logits: true});
      const at = again ? again.logits.findIndex((v, i) => !Object.is(v, keep_ref.logits[i])) : -1;
      if (!again || blocks.path !== 'mixed' || at >= 0 || again.token !== keep_ref.token) {
        fail(`${what}: the block runner kept ${kept} of ${block_from} positions for a prompt of ${kKeepAt + 1} (expected ` +
             `${want_kept}; ${blocks.path} path) and ran to ${kKeepAt}: logit ${at} is ${again?.logits?.[at]}, token by ` +
             `token ${keep_ref.logits[at]} (ids ${again?.token}, ${keep_ref.token})`);
      }
      ++checks;
    }
    release?.();
    await mixed.Drain();
    await whole.Drain();
    // The budget reserves every sink row per layer (MixedCosts); sinks beside the R resident pages'
    // bytes are at most R pages' rows at once, so with more sinks than that the rest is never held.
    const unheld_sinks = c.n_layers * 2 * Math.max(0, sinks - R * kPage) * c.kv_dim * 4;
    const whole_peak = whole.resident.counts.peak_kv_bytes;
    if (whole_peak > whole_budget) {
      fail(`${what}: the whole-context resident cache held up to ${whole_peak} bytes of KV on the GPU, over its budget ` +
           `of ${whole_budget} (its resident_bytes)`);
    }
    const peak = mixed.resident.counts.peak_kv_bytes;
    if (peak !== budget - unheld_sinks) {
      fail(`${what}: the mixed cache held at most ${peak} bytes of KV on the GPU, not the budget of ${budget}` +
           (unheld_sinks ? ` less the ${unheld_sinks} bytes of sinks beyond the ${R} resident pages'` : ''));
    }
    const evictions = mixed.resident.counts.evictions, want_evictions = c.n_layers * (run / kPage - R);
    if (evictions !== want_evictions) fail(`${what}: ${evictions} pages evicted, expected ${want_evictions}`);
    const a = M._malloc(page_bytes), b = M._malloc(page_bytes);
    for (let layer = 0; layer < c.n_layers; ++layer) {
      const held = M._kvq_web_kv_positions(mixed.kv, layer);
      if (held !== run) fail(`${what}: layer ${layer}'s master holds ${held} positions, expected ${run}`);
      // resN: the pages whose rows are all encoded (K's in groups of G); the rest are f32 rows still
      const encoded = res ? Math.min(Math.floor(Math.max(0, held - res) / G) * G, held - res) : held;
      for (let page = 0; page < Math.floor(encoded / kPage) || (!res && page < held / kPage); ++page) {
        if (M._kvq_web_kv_read_page(stream.kv, layer, page, a) !== 0 || M._kvq_web_kv_read_page(mixed.kv, layer, page, b) !== 0) {
          fail(`${what}: read_page ${layer}/${page}: ${M.UTF8ToString(M._kvq_web_last_error())}`);
          continue;
        }
        const x = M.HEAPU8.subarray(a, a + page_bytes), y = M.HEAPU8.subarray(b, b + page_bytes);
        const at = x.findIndex((v, i) => v !== y[i]);
        if (at >= 0) fail(`${what}: layer ${layer} page ${page}: master byte ${at} is ${y[at]}, streamed ${x[at]}`);
        ++checks;
      }
    }
    M._free(a);
    M._free(b);
    per_format[format] = {positions: positions - f0.positions, checks: checks - f0.checks,
                          failures: failures.length - f0.failures, seconds: (performance.now() - f0.t) / 1000};
  }
  for (const r of [whole, stream, mixed, blocks, ...(rows_runners ?? [])]) r.Destroy();
  M._kvq_web_model_free(model);
  if (rows_model) M._kvq_web_model_free(rows_model);
  device.destroy();
  return {formats, per_format, positions, checks, streamed_bytes: streamed, submits, ratio, failures,
          seconds: (performance.now() - t0) / 1000};
}
