// What the page's browser tests share: failures collected (and printed as they happen), the bundle
// served by tools/serve_web.mjs, headless Chromium, a page opened and watched for errors, synth
// models written by the native kvq, and the native greedy ids to compare with.
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import {createRequire} from 'node:module';
import path from 'node:path';

import {ServeStatic} from '../../../tools/serve_web.mjs';

const kChromium = process.env.KVQ_CHROMIUM || '/usr/bin/chromium';

export class Checks {
  constructor(name) {
    this.name = name;
    this.failures = [];
    this.t_start = Date.now();
  }
  Fatal(message) {
    console.error(`${this.name}: FAIL: ${message}`);
    process.exit(1);
  }
  Fail(message) {
    this.failures.push(message);
    console.error(`${this.name}: FAIL: ${message}`);
  }
  Ok(message) {
    console.log(`${this.name}: ok: ${message}`);
  }
  Log(message) {
    console.log(`${this.name}: ${message}`);
  }
  // Fails with `message` unless cond holds; says ok otherwise. Returns cond.
  Expect(cond, message) {
    if (cond) this.Ok(message);
    else this.Fail(message);
    return Boolean(cond);
  }
  // Strict equality of two id lists; a mismatch names the first differing position.
  SameIds(what, got, want) {
    let i = 0;
    while (i < Math.min(got.length, want.length) && got[i] === want[i]) ++i;
    if (i === got.length && got.length === want.length) return this.Expect(true, `${what}: ${got.length} ids equal`);
    return this.Expect(false, `${what}: first difference at position ${i} of ${got.length} (expected ${want.length}): ` +
                              `got ${JSON.stringify(got.slice(i, i + 6))}, expected ${JSON.stringify(want.slice(i, i + 6))}`);
  }
  Finish() {
    const seconds = ((Date.now() - this.t_start) / 1000).toFixed(1);
    if (this.failures.length) {
      console.error(`${this.name}: ${this.failures.length} failure(s) in ${seconds} s`);
      process.exit(1);
    }
    console.log(`${this.name}: all passed in ${seconds} s`);
  }
}

// Chromium (headless, software WebGPU as the golden test runs it) and playwright-core from npm_dir.
export async function LaunchChromium(checks, npm_dir) {
  if (!fs.existsSync(kChromium)) checks.Fatal(`no Chromium at ${kChromium} (scripts/setup.sh installs it)`);
  let chromium;
  try {
    ({chromium} = createRequire(path.join(path.resolve(npm_dir), 'node_modules', '/'))('playwright-core'));
  } catch (e) {
    checks.Fatal(`playwright-core is not in ${npm_dir}/node_modules (the web.fetch_playwright fixture): ${e.message}`);
  }
  return chromium.launch({
    executablePath: kChromium,
    headless: true,
    args: ['--no-sandbox', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--enable-unsafe-webgpu', '--enable-features=Vulkan',
           '--use-vulkan=swiftshader', '--use-webgpu-adapter=swiftshader'],
  });
}

// The bundle on 127.0.0.1 (any free port); isolation: the COOP/COEP headers. Returns {server, base}.
export async function Serve(checks, bundle, isolation = true) {
  for (const file of ['index.html', 'kvq.js', 'kvq-threads.js', 'kvq-threads.worker.js', 'kvq-scalar.js']) {
    if (!fs.existsSync(path.join(bundle, file))) checks.Fatal(`the bundle ${bundle} has no ${file}`);
  }
  const server = await ServeStatic(bundle, {
    isolation, on_refusal: (method, url, code, why) => checks.Fail(`server: ${method} ${url}: ${code} ${why}`)});
  return {server, base: `http://127.0.0.1:${server.address().port}`};
}

// index.html?query opened, page errors and console errors failing the test, its start awaited.
// Returns {page, info} (info: what kvqPage.ready resolved to).
export async function OpenPage(checks, browser, base, query, {expect_console_errors = false} = {}) {
  const page = await browser.newPage();
  const where = `index.html${query}`;
  page.on('pageerror', (e) => checks.Fail(`${where}: page error: ${e.message}`));
  page.on('requestfailed', (r) => checks.Fail(`${where}: request failed: ${r.url()}: ${r.failure()?.errorText}`));
  const seen = new Set();
  const OnConsole = (origin) => (msg) => {
    if (msg.type() !== 'error' || seen.has(msg.text()) || expect_console_errors) return;
    seen.add(msg.text());
    checks.Fail(`${where}: console error (${origin}): ${msg.text()}`);
  };
  page.on('console', OnConsole('page'));
  page.on('worker', (w) => w.on('console', OnConsole(`worker ${w.url()}`)));
  await page.goto(`${base}/index.html${query}`);
  const info = await page.evaluate(() => window.kvqPage.ready);
  checks.Log(`${where}: ${info.module}, ${info.threads} thread(s)${info.threads_why_not ? ` (${info.threads_why_not})` : ''}, ` +
             `GPU ${info.gpu ?? `none: ${info.gpu_why_not}`}`);
  return {page, info};
}

// A GGUF at `name` in dir from `kvq synth` (fixed seed), returns its path.
export function Synth(kvq_cli, dir, name, args) {
  const file = path.join(dir, name);
  execFileSync(kvq_cli, ['synth', ...args, '--seed', '1', '-t', '1', '-o', file], {encoding: 'utf8'});
  return file;
}

// Native `kvq run`'s greedy ids (BOS and prompt included) with n_new new tokens.
export function NativeIds(kvq_cli, model, prompt, n_new, {kv = 'f16', threads = 1} = {}) {
  const out = execFileSync(kvq_cli, ['run', '-m', model, '--prompt', prompt, '--temp', '0', '-n', String(n_new),
                                     '--kv', kv, '-t', String(threads), '--json'], {encoding: 'utf8'});
  return JSON.parse(out).tokens;
}

// Text a page element shows.
export const Text = (page, selector) => page.$eval(selector, (e) => e.textContent);
