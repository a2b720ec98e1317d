// The page's benchmark (web/bench.js through window.kvqPage.bench) in headless Chromium on the
// SwiftShader adapter, tiny sizes: the bundled stories260K (F32 weights), a 32-token prompt, 8 new
// tokens, depths 0 and 64, f16 KV. Checked: the JSON's shape (every run of both paths with
// positive prefill and decode rates and 8 ids), that the GPU path and the WebAssembly path gave
// the same greedy ids at each depth, that the GPU path prefilled in blocks (the resident path: one
// submit and one readback per block of at most 64 ids; the depth's ids and the prompt's are each
// one block here) and, run again with gpu_prefill_block 1, token by token. Both figures are
// printed: SwiftShader emulates the GPU on the CPU, so they show dispatch and submit overhead, not
// what a GPU does.
// Optional sizes (for figures, not for ctest): PROMPT_TOKENS NEW_TOKENS DEPTHS (comma-separated).
// Usage: node bench_test.mjs BUNDLE_DIR PLAYWRIGHT_NPM_DIR [PROMPT_TOKENS NEW_TOKENS DEPTHS]
import {Checks, LaunchChromium, OpenPage, Serve} from './browser_util.mjs';

const checks = new Checks('bench_test');
const [bundle, npm_dir, prompt_arg, new_arg, depths_arg] = process.argv.slice(2);
if (!bundle || !npm_dir) checks.Fatal('usage: bench_test.mjs BUNDLE_DIR PLAYWRIGHT_NPM_DIR [PROMPT_TOKENS NEW_TOKENS DEPTHS]');

const kOptions = {prompt_tokens: Number(prompt_arg ?? 32), new_tokens: Number(new_arg ?? 8),
                  depths: (depths_arg ?? '0,64').split(',').map(Number), kv_k: 'f16', kv_v: 'f16'};

// The checks of one benchmark result; block: the GPU prefill block it ran with.
function Check(result, block) {
  const what = `gpu_prefill_block ${block}`;
  const n_runs = 2 * kOptions.depths.length;
  checks.Expect(Array.isArray(result.runs) && result.runs.length === n_runs, `${what}: ${n_runs} runs (depths x 2 paths)`);
  for (const r of result.runs ?? []) {
    const run = `${what}: ${r.path} at depth ${r.depth}`;
    checks.Expect(!r.skipped && r.prefill_tok_s > 0 && r.decode_tok_s > 0 && r.ids?.length === kOptions.new_tokens,
                  `${run}: prefill ${r.prefill_tok_s} tok/s, decode ${r.decode_tok_s} tok/s, ${r.ids?.length} ids` +
                  `${r.skipped ? ` (skipped: ${r.skipped})` : ''}`);
    if (r.path !== 'gpu') continue;
    // The depth's ids and the prompt's, each in the page's 64-id calls, each call in blocks.
    const blocks = Math.ceil(r.depth / block) + Math.ceil(kOptions.prompt_tokens / block);
    const p = r.gpu?.prefill;
    checks.Expect(r.gpu?.kv_path === 'resident' && p?.tokens === r.depth + kOptions.prompt_tokens && p.submits === blocks &&
                  p.readbacks === blocks && r.gpu.submits_per_step === 1 && r.gpu.readbacks_per_step === 1,
                  `${run}: the prompt's ${blocks} block(s): ${JSON.stringify(r.gpu)}`);
    // The adapter here is SwiftShader: MatvecKernelFor keeps a row per invocation there.
    checks.Expect(r.gpu?.matvec_kernel === 'rows', `${run}: the matvec kernel on an emulated adapter is ${r.gpu?.matvec_kernel} (want rows)`);
  }
  checks.Expect(result.same_ids?.length === kOptions.depths.length && result.same_ids.every((s) => s.same),
                `${what}: the GPU and WebAssembly paths' greedy ids equal at every depth (${JSON.stringify(result.same_ids)})`);
}

const {server, base} = await Serve(checks, bundle);
const browser = await LaunchChromium(checks, npm_dir);
try {
  const {page, info} = await OpenPage(checks, browser, base, '');
  if (!info.gpu) checks.Fatal(`no WebGPU adapter in the page: ${info.gpu_why_not}`);
  const rates = {};
  for (const block of [64, 1]) {
    const result = await page.evaluate((o) => window.kvqPage.bench(o), {...kOptions, gpu_prefill_block: block});
    checks.Expect(result.adapter === info.gpu && result.model?.vocab_size > 0 && result.prompt_tokens === kOptions.prompt_tokens,
                  `gpu_prefill_block ${block}: the JSON names the adapter (${result.adapter}) and the model`);
    Check(result, block);
    rates[block] = result.runs.map((r) => `${r.path}@${r.depth}: prefill ${r.prefill_tok_s}, decode ${r.decode_tok_s}`);
  }
  const shown = await page.$eval('#bench-out', (e) => e.textContent);
  checks.Expect(JSON.parse(shown).gpu_prefill_block === 1, 'the page shows the last result as JSON');
  checks.Log(`tok/s on SwiftShader (a CPU emulation: dispatch and submit overhead, not a GPU's speed): ` +
             `prefill in blocks of 64: ${rates[64].join('; ')} | token by token: ${rates[1].join('; ')}`);
} finally {
  await browser.close();
  server.close();
}
checks.Finish();
