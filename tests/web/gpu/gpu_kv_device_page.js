// The C++ cache's device tier over WebGPU, checked in the page: a kvq::KvCache
// in the WebAssembly module (the bundle's kvq.js) holds the master rows in any format and transform,
// and KvCache::AttendOnDevice streams its pages into the GPU slots of web/gpu/kv_device.js, which
// attends over them. Checks, per spec (every format, ten transform specs), GQA shape and query
// block (a decode step; a prefill block of 4):
//   1. bit identity: the output for page sizes 32, 64, 96 and budgets of 2 and 3 slots equals, bit
//      for bit, the output of one window (one page holding every position);
//   2. that output vs attention in double over the rows as kvq reads them (kvq_web_kv_rows; prerope
//      keys roped there by kvq's arithmetic) and the queries the GPU read, within the bound derived
//      in gpu_attention_page.js (Reference); with rotated specs the queries the GPU rotated and its
//      output before unrotation, and the rotations themselves equal kvq's f32 steps bit for bit;
//   3. the budget: GPU bytes of KV slots ≤ the budget, a context 100× the positions the budget holds;
//   4. seed 000's three bugs injected into the device (a row dropped at each boundary, a row counted
//      twice there, the output normalised there) each change the bits, on two windows and many.
import {GpuKvDevice} from '/web/gpu/kv_device.js';
import {Reference, SameBits} from '/test/gpu_attention_page.js';

// mulberry32: the same numbers in every browser.
export function Rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
// n numbers, roughly N(0, scale²) (sum of uniforms), every 37th a 6-sigma outlier.
export function Rows(n, rng, scale) {
  const x = new Float32Array(n);
  for (let i = 0; i < n; ++i) x[i] = i % 37 === 5 ? 6 * scale : (rng() + rng() + rng() - 1.5) * 2 * scale;
  return x;
}

// kvq's RotateHeads / UnrotateHeads (hadamard.cc) in f32, step for step.
function Fwht(x, d) {
  for (let half = 1; half < d; half *= 2) {
    for (let block = 0; block < d; block += 2 * half) {
      for (let i = block; i < block + half; ++i) {
        const a = x[i], b = x[i + half];
        x[i] = Math.fround(a + b);
        x[i + half] = Math.fround(a - b);
      }
    }
  }
}
function RotateF32(x, d, signs, inverse) {
  const out = new Float32Array(x), norm = Math.fround(1 / Math.sqrt(d));
  for (let h = 0; h < x.length / d; ++h) {
    const v = out.subarray(h * d, (h + 1) * d);
    if (!inverse) for (let i = 0; i < d; ++i) v[i] = Math.fround(v[i] * signs[i]);
    Fwht(v, d);
    for (let i = 0; i < d; ++i) v[i] = inverse ? Math.fround(Math.fround(v[i] * norm) * signs[i]) : Math.fround(v[i] * norm);
  }
  return out;
}

/** The bundle's kvq.js module (SIMD build), loaded into this page. */
export async function LoadModule(bundle_url) {
  await new Promise((ok, bad) => {
    const s = document.createElement('script');
    s.src = `${bundle_url}/kvq.js`;
    s.onload = ok;
    s.onerror = () => bad(new Error(`could not load ${s.src}`));
    document.head.appendChild(s);
  });
  return createKvq({locateFile: (f) => `${bundle_url}/${f}`});  // eslint-disable-line no-undef
}

export async function RunGpuKvDeviceTests(bundle_url) {
  const t0 = performance.now();
  const failures = [];
  const fail = (m) => failures.push(m);
  let checks = 0, cases = 0, worst = 0;
  const adapter = await navigator.gpu?.requestAdapter();
  if (!adapter) return {cases, checks, failures: ['no WebGPU adapter'], seconds: 0};
  const device = await adapter.requestDevice();
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const M = await LoadModule(bundle_url);
  const gpu = new GpuKvDevice(device);
  M.kvqDevice = gpu;
  const Error_ = () => M.UTF8ToString(M._kvq_web_last_error());
  const Floats = (x) => {
    const p = M._malloc(Math.max(4, x.length * 4));
    M.HEAPF32.set(x, p >> 2);
    return p;
  };
  const Str = (s) => {
    const n = M.lengthBytesUTF8(s) + 1, p = M._malloc(n);
    M.stringToUTF8(s, p, n);
    return p;
  };

  // A one-layer cache holding `k`, `v` ([n][n_kv_heads][head_dim]); 0 and a failure if refused.
  function Cache(spec, s, n, page, budget, k, v) {
    const ks = Str(spec), vs = Str(spec);
    const h = M._kvq_web_kv_new(ks, vs, 1, s.n_kv_heads, s.head_dim, s.max_positions, page, budget, 500.0, 1,
                                s.head_dim - 4);
    M._free(ks);
    M._free(vs);
    if (!h) {
      fail(`${spec} page ${page} budget ${budget}: ${Error_()}`);
      return 0;
    }
    const kp = Floats(k), vp = Floats(v);
    if (M._kvq_web_kv_append(h, 0, kp, vp, n) !== 0) fail(`${spec}: append: ${Error_()}`);
    // An append of no rows: every query then reads the rows as the cache holds them now (not as
    // it held them when its own row came, which this single append would otherwise keep).
    if (M._kvq_web_kv_append(h, 0, kp, vp, 0) !== 0) fail(`${spec}: append: ${Error_()}`);
    M._free(kp);
    M._free(vp);
    return h;
  }
  async function Attend(h, q, s, queries, n) {
    gpu.SetQueries(q, s.n_kv_heads * s.q_per_kv);
    if (M._kvq_web_kv_attend_device(h, 0, n - queries, queries) !== 0) {
      fail(`attend: ${Error_()}`);
      return new Float32Array(0);
    }
    return gpu.Output();
  }
  function SlotBytes(spec, s, page) {
    const h = Cache(spec, s, 0, page, 0, new Float32Array(0), new Float32Array(0));
    const slot = JSON.parse(M.UTF8ToString(M._kvq_web_kv_plan(h))).slot_bytes;
    M._kvq_web_kv_free(h);
    return slot;
  }

  // Checks 1-2 (and 4 when `bugs`) for one spec and shape over n positions.
  async function Check(spec, s, n, {pages = [32, 64, 96], budgets = [[32, 2], [64, 3]], bugs = false} = {}) {
    ++cases;
    const name = `${spec} ${s.n_kv_heads}x${s.q_per_kv} n=${n}`;
    const rng = Rng(n * 7919 + spec.length * 31 + s.q_per_kv);
    const elems = s.n_kv_heads * s.head_dim, n_q = s.n_kv_heads * s.q_per_kv;
    const k = Rows(n * elems, rng, 2), v = Rows(n * elems, rng, 2);
    const one = Cache(spec, s, n, Math.ceil(n / 32) * 32, 0, k, v);
    if (!one) return;
    // The rows as attention reads them, for the reference.
    const kd = M._malloc(n * elems * 4), vd = M._malloc(n * elems * 4);
    if (M._kvq_web_kv_rows(one, 0, kd, vd) !== 0) fail(`${name}: rows: ${Error_()}`);
    const k_rows = M.HEAPF32.slice(kd >> 2, (kd >> 2) + n * elems), v_rows = M.HEAPF32.slice(vd >> 2, (vd >> 2) + n * elems);
    M._free(kd);
    M._free(vd);
    for (const queries of [1, 4]) {
      const q = Rows(queries * n_q * s.head_dim, rng, 1);
      const whole = await Attend(one, q, s, queries, n);
      // 2. vs double, in the domain the kernel computes in.
      const L = gpu.L;
      const q_read = await gpu.QueriesRead(), rotated_out = await gpu.OutputRotated();
      if (L.rotate_queries) {
        ++checks;
        const why = SameBits(q_read, RotateF32(q, s.head_dim, L.rotation_signs, false));
        if (why) fail(`${name}: the GPU's query rotation differs from kvq's (${why})`);
      }
      if (L.unrotate_output) {
        ++checks;
        const why = SameBits(whole, RotateF32(rotated_out, s.head_dim, L.rotation_signs, true));
        if (why) fail(`${name}: the GPU's output unrotation differs from kvq's (${why})`);
      }
      const c = {head_dim: s.head_dim, q_per_kv: s.q_per_kv, n_kv_heads: s.n_kv_heads};
      for (let t = 0; t < queries; ++t) {
        const qt = q_read.subarray(t * n_q * s.head_dim, (t + 1) * n_q * s.head_dim);
        for (let h = 0; h < n_q; ++h) {
          const {out, bound} = Reference(c, qt, k_rows, v_rows, h, n - queries + t);
          for (let j = 0; j < s.head_dim; ++j) {
            ++checks;
            const got = rotated_out[(t * n_q + h) * s.head_dim + j], err = Math.abs(got - out[j]);
            worst = Math.max(worst, err / bound[j]);
            if (!(err <= bound[j])) fail(`${name} q${queries}: token ${t} head ${h} [${j}]: GPU ${got} vs double ${out[j]}, over ${bound[j]}`);
          }
        }
      }
      // 1. bit identity across pages and budgets.
      const arms = [...pages.map((p) => [p, 0]), ...budgets.map(([p, slots]) => [p, slots * SlotBytes(spec, s, p) + 8])];
      for (const [page, budget] of arms) {
        if (page >= n) continue;
        const h = Cache(spec, s, n, page, budget, k, v);
        if (!h) continue;
        gpu.peak_kv_bytes = 0;
        const out = await Attend(h, q, s, queries, n);
        ++checks;
        const why = SameBits(out, whole);
        if (why) fail(`${name} q${queries}: page ${page} budget ${budget} differs from one window (${why})`);
        if (budget > 0 && gpu.peak_kv_bytes > budget) fail(`${name}: GPU KV slots ${gpu.peak_kv_bytes} B over the budget ${budget} B`);
        // 4. the injected bugs, each seen.
        if (bugs) {
          for (const bug of ['drop_first_row', 'double_count_row', 'normalise_at_boundary']) {
            gpu.bug = bug;
            const bad = await Attend(h, q, s, queries, n);
            gpu.bug = undefined;
            ++checks;
            if (!SameBits(bad, whole)) fail(`${name} q${queries}: injected ${bug} at page ${page} went unseen`);
          }
        }
        M._kvq_web_kv_free(h);
      }
    }
    M._kvq_web_kv_free(one);
  }

  const shape = (n_kv_heads, q_per_kv, max_positions = 256) => ({n_kv_heads, q_per_kv, head_dim: 16, max_positions});
  const formats = JSON.parse(M.UTF8ToString(M._kvq_web_formats())).map((f) => f.name);
  for (const f of formats) await Check(f, shape(2, 2), 200);
  for (const spec of ['int4+rot', 'int8+sink4', 'int4+res40', 'int4-kivi+sink4+res16', 'int2-kivi+rot',
                      'fp8-e4m3+sink3', 'int4+prerope', 'int4-kivi+prerope+sink2+res8', 'f32+prerope',
                      'fp4-e2m1+rot+sink5+res33']) {
    await Check(spec, shape(2, 2), 200);
    await Check(spec, shape(2, 2), 30, {pages: [], budgets: []});  // one page: head, block and residual rows
  }
  for (const [kv, g] of [[1, 1], [1, 4], [2, 3], [4, 2]]) {
    await Check('int4', shape(kv, g), 150, {budgets: []});
    await Check('int4-kivi+sink2+res8', shape(kv, g), 150, {budgets: []});
  }
  // Seed 000's bugs: on two windows (40 positions, pages of 32) and many (200).
  await Check('int4-kivi+sink2+res8', shape(2, 2), 40, {pages: [32], budgets: [], bugs: true});
  await Check('int8', shape(2, 2), 200, {pages: [32], budgets: [[32, 2]], bugs: true});
  // 3. A context 100× what the budget holds: 2 slots of 32-position pages, 6,400 positions.
  {
    const s = shape(2, 2, 6400), n = 6400;
    const budget = 2 * SlotBytes('int4', s, 32) + 8;
    await Check('int4', s, n, {pages: [], budgets: [[32, 2]]});
    const h = Cache('int4', s, 0, 32, budget, new Float32Array(0), new Float32Array(0));
    const plan = JSON.parse(M.UTF8ToString(M._kvq_web_kv_plan(h)));
    ++checks;
    if (plan.device_slots !== 2 || plan.device_bytes > budget || n < 100 * 2 * 32) {
      fail(`the 100x case: ${plan.device_slots} slots, ${plan.device_bytes} B for a budget of ${budget} B`);
    }
    M._kvq_web_kv_free(h);
  }
  device.destroy();
  return {cases, checks, failures, worst_error_over_bound: worst, seconds: (performance.now() - t0) / 1000};
}
