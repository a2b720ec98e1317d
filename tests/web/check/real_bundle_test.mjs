// The built web bundle against tools/check_bundle.mjs (issue 13's must-show): the check passes on a copy and
// reaches every file in it; removing any one reached file makes it fail naming that file; a dynamic import()
// of a file that was not copied, added to the page's module (and to each other script), makes it fail too.
// Fails, never skips, when the bundle is missing. Usage: node real_bundle_test.mjs BUNDLE [check_bundle.mjs]
// The many checks run in this process (check_bundle.mjs's CheckBundle: files unchanged between copies are
// parsed once); the command itself runs once, on the pristine copy, and must print what CheckBundle returns.
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import test from 'node:test';
import {fileURLToPath, pathToFileURL} from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const bundle = process.argv[2] ?? '';
const checker = path.resolve(process.argv[3] ?? path.join(here, '../../../tools/check_bundle.mjs'));
let is_dir = false;
try {
  is_dir = bundle !== '' && fs.statSync(bundle).isDirectory();
} catch { /* reported below */ }
if (!is_dir) {
  console.error(`real_bundle_test: the web bundle '${bundle}' is not a directory: build it first (the wasm ` +
                'build writes build/wasm/web; KVQ_WEB_BUNDLE_DIR names it)');
  process.exit(1);
}

// The files docs/architecture.md's bundle layout promises; the walk must reach each of them.
const kPromised = ['index.html', 'kvq.js', 'kvq.wasm', 'kvq-scalar.js', 'kvq-scalar.wasm', 'models/stories260K.bin',
                   'models/tok512.bin'];
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'kvq-check-real-'));
process.on('exit', () => fs.rmSync(scratch, {recursive: true, force: true}));
let copies = 0;
function Copy() {
  const dir = path.join(scratch, `web${copies++}`);
  fs.cpSync(bundle, dir, {recursive: true, dereference: true});
  return dir;
}
const {CheckBundle} = await import(pathToFileURL(checker).href);
function Command(dir, ...args) {
  const result = spawnSync(process.execPath, [checker, dir, ...args], {encoding: 'utf8'});
  const Lines = (text) => text.split('\n').filter((line) => line !== '');
  return {status: result.status, out: Lines(result.stdout), err: Lines(result.stderr)};
}
const Check = (dir, ...args) => CheckBundle(dir, {list: args.includes('--list')});
function AllFiles(dir, under = '') {
  return fs.readdirSync(path.join(dir, under), {withFileTypes: true}).flatMap((entry) => {
    const rel = path.posix.join(under, entry.name);
    return entry.isDirectory() ? AllFiles(dir, rel) : [rel];
  });
}
const Escape = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

// The check's --list: bundle-relative path -> how the page loads it.
const pristine = Copy();
const listed = Command(pristine, '--list');
const reached = new Map(listed.out.filter((line) => line.startsWith('reached '))
                            .map((line) => line.split(' ').slice(1).reverse()));

test('the check passes on the copied bundle and reaches every file in it', () => {
  assert.equal(listed.status, 0, listed.out.join('\n'));
  assert.deepEqual(Check(pristine, '--list'), listed, 'CheckBundle returns what the command prints');
  assert.deepEqual(listed.err, [], 'files the walk did not reach');
  assert.equal(listed.out.at(-1), `check_bundle: ${pristine}: ${reached.size} files reached from index.html, ` +
                                  'all present');
  assert.deepEqual([...reached.keys()].sort(), AllFiles(pristine).sort());
  for (const rel of kPromised) assert.ok(reached.has(rel), `${rel} is not reached from index.html`);
  assert.ok([...reached.values()].includes('module'), 'the page loads no module script');
});

test('removing any one reached file makes the check fail naming it', () => {
  assert.ok(reached.size >= kPromised.length);
  for (const rel of reached.keys()) {
    const dir = Copy();
    fs.rmSync(path.join(dir, rel));
    const result = Check(dir);
    // Named as the reference (raw, or ./raw) or by where it resolves; the entry page by --entry.
    const named = new RegExp(`: (\\./)?${Escape(rel)} is not in the bundle$|` +
                             `is not in the bundle \\(resolves to ${Escape(rel)}\\)$`);
    assert.equal(result.status, 1, `removed ${rel}: ${result.out.join('\n')}`);
    assert.ok(result.out.some((line) => named.test(line)), `removed ${rel}, got:\n${result.out.join('\n')}`);
    fs.rmSync(dir, {recursive: true});
  }
});

test('a dynamic import of a file that was not copied fails, in the page module and in every script', () => {
  const missing = 'kvq-not-copied.js';
  const scripts = [...reached].filter(([, how]) => how !== 'html' && how !== 'css' && how !== 'file');
  assert.ok(scripts.length > 0);
  for (const [rel] of scripts) {
    const dir = Copy();
    const file = path.join(dir, rel);
    const text = fs.readFileSync(file, 'utf8');
    const line = text.split('\n').length + 1;
    const depth = rel.split('/').length - 1;
    const specifier = (depth === 0 ? './' : '../'.repeat(depth)) + missing;
    fs.writeFileSync(file, `${text}\nimport('${specifier}');\n`);
    const result = Check(dir);
    assert.equal(result.status, 1, `import() added to ${rel}`);
    const expected = `check_bundle: ${dir}/${rel}:${line}: import('${specifier}'): ${specifier} is not in the ` +
                     `bundle${depth === 0 ? '' : ` (resolves to ${missing})`}`;
    assert.deepEqual(result.out, [expected]);
    fs.rmSync(dir, {recursive: true});
  }
});
