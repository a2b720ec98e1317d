// Fixture bundles for tools/check_bundle.mjs: a complete one passes with exactly one summary line; each broken
// one (a missing static/dynamic import, worker, importScripts target, fetch target, .wasm named by glue-like
// code, script src; references escaping the bundle; a non-literal import()) fails; a fetch of the serving
// origin's route (new URL(path, location.origin)) is not followed with exactly the expected
// lines, the referring file:line and the reference named. Usage: node fixtures_test.mjs [check_bundle.mjs]
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import test from 'node:test';
import {fileURLToPath} from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const checker = path.resolve(process.argv[2] ?? path.join(here, '../../../tools/check_bundle.mjs'));
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'kvq-check-fixtures-'));
process.on('exit', () => fs.rmSync(scratch, {recursive: true, force: true}));

// A bundle with one of every kind of reference the check follows.
const kComplete = {
  'index.html': [
    '<!doctype html>',
    '<html><head><meta charset="utf-8">',
    '<link rel="stylesheet" href="style.css">',
    '<!-- a > b: <script src="commented-out.js"></script> -->',
    "<style>.dot { background: url('img/dot.png'); }</style>",
    '</head><body>',
    '<img src="logo.png" alt="">',
    '<script src="boot.js"></script>',
    '<script src="glue/page-glue.js"></script>',
    '<script type="module" src="js/app.js"></script>',
    '<script type="module">',
    "  import {Ui} from './js/ui.js';",
    '  Ui();',
    '</script>',
    '</body></html>',
  ].join('\n'),
  'style.css': 'body {\n  background: url("img/bg.png?v=1#top");\n}\n',
  'logo.png': 'png',
  'img/bg.png': 'png',
  'img/dot.png': 'png',
  'boot.js': 'var booted = true;\n',
  'js/app.js': [
    '// The page module.',
    "import {Ui} from './ui.js';",
    'Ui();',
    "const kModel = 'models/m.bin';",
    'async function Start(simd) {',
    "  const lazy = await import('./lazy.js');",
    "  const worker = new Worker(simd ? 'worker/w.js' : `worker/w.js`);",
    '  const bytes = await (await fetch(kModel)).arrayBuffer();',
    "  const icon = new URL('../logo.png', import.meta.url);",
    "  const Preload = (FS) => FS.createPreloadedFile('/models', 'tok.bin', 'models/tok.bin', true, false);",
    '  return [lazy, worker, bytes, icon];',
    '}',
    'Start(true);',
    '// A route of the serving origin (a server\'s API), not a file of the bundle: not followed.',
    "fetch(new URL('/v1/models', location.origin));",
  ].join('\n'),
  'js/ui.js': 'export function Ui() {}\n',
  'js/lazy.js': 'export const lazy = 1;\n',
  // A classic worker: importScripts and fetch resolve against the worker's own URL.
  'worker/w.js': "importScripts('../glue/glue.js', 'lib/helper.js');\n",
  // Loaded by the worker: its fetch resolves against the worker's URL (worker/w.js), not its own.
  'worker/lib/helper.js': "fetch('../models/tok.bin');\nimportScripts('lib/extra.js');\n",
  'worker/lib/extra.js': 'var extra = 1;\n',
  // Emscripten-like glue: names its .wasm as a literal and fetches it through locateFile, relative to the
  // worker's URL in a worker (self.location), so the worker's folder holds the .wasm, not the glue's.
  'glue/glue.js': [
    'var scriptDirectory = self.location.href;',
    'function locateFile(path) { return scriptDirectory + path; }',
    'var wasmBinaryFile;',
    'wasmBinaryFile = "glue.wasm";',
    'wasmBinaryFile = locateFile(wasmBinaryFile);',
    "fetch(wasmBinaryFile, {credentials: 'same-origin'});",
  ].join('\n'),
  'worker/glue.wasm': 'wasm',
  // Glue loaded by the page itself finds its .wasm beside itself (document.currentScript.src).
  'glue/page-glue.js': 'function locateFile(path) { return path; }\nvar wasmBinaryFile = "page.wasm";\n',
  'glue/page.wasm': 'wasm',
  'models/m.bin': 'model',
  'models/tok.bin': 'tokenizer',
};

let fixture_count = 0;
// Writes `files` (relative path -> text) into a fresh folder; `changes` may delete (null) or replace files.
function MakeBundle(changes = {}) {
  const dir = path.join(scratch, `bundle${fixture_count++}`);
  for (const [rel, text] of Object.entries({...kComplete, ...changes})) {
    if (text === null) continue;
    fs.mkdirSync(path.dirname(path.join(dir, rel)), {recursive: true});
    fs.writeFileSync(path.join(dir, rel), text);
  }
  return dir;
}

function Check(dir, ...args) {
  const result = spawnSync(process.execPath, [checker, dir, ...args], {encoding: 'utf8'});
  const Lines = (text) => text.split('\n').filter((line) => line !== '');
  return {status: result.status, out: Lines(result.stdout), err: Lines(result.stderr)};
}

// The 1-based line of the first line of `rel` in kComplete (or `text`) that contains `needle`.
function LineOf(rel, needle, text = kComplete[rel]) {
  const index = text.split('\n').findIndex((line) => line.includes(needle));
  assert.notEqual(index, -1, `${needle} not in ${rel}`);
  return index + 1;
}

function ExpectFailure(changes, expected_lines) {
  const dir = MakeBundle(changes);
  const result = Check(dir);
  assert.deepEqual(result.out, expected_lines.map((line) => `check_bundle: ${dir}/${line}`));
  assert.equal(result.status, 1);
}

test('a complete bundle passes with one summary line and no warnings', () => {
  const dir = MakeBundle();
  const result = Check(dir);
  const count = Object.keys(kComplete).length;
  assert.deepEqual(result.out, [`check_bundle: ${dir}: ${count} files reached from index.html, all present`]);
  assert.deepEqual(result.err, []);
  assert.equal(result.status, 0);
});

test('every file of the complete bundle is reached, each loaded the way a browser would', () => {
  const result = Check(MakeBundle(), '--list');
  assert.deepEqual(result.out.filter((line) => line.startsWith('reached ')), [
    'reached file img/bg.png', 'reached file img/dot.png', 'reached html index.html', 'reached module js/app.js', 'reached module js/lazy.js',
    'reached module js/ui.js', 'reached file logo.png', 'reached file models/m.bin', 'reached file models/tok.bin',
    'reached css style.css', 'reached classic boot.js', 'reached worker-classic glue/glue.js', 'reached classic glue/page-glue.js', 'reached file glue/page.wasm',
    'reached file worker/glue.wasm', 'reached worker-classic worker/lib/extra.js', 'reached worker-classic worker/lib/helper.js',
    'reached worker-classic worker/w.js',
  ].sort((a, b) => a.split(' ')[2].localeCompare(b.split(' ')[2])));
});

test('a missing static import names the importing file and line', () => {
  ExpectFailure({'js/ui.js': null}, [
    `index.html:${LineOf('index.html', 'import {Ui}')}: import {Ui} from './js/ui.js';: ./js/ui.js is not in the ` +
        'bundle',
    `js/app.js:${LineOf('js/app.js', 'import {Ui}')}: import {Ui} from './ui.js';: ./ui.js is not in the bundle ` +
        '(resolves to js/ui.js)',
  ]);
});

test('a missing dynamically imported module is caught', () => {
  ExpectFailure({'js/lazy.js': null}, [
    `js/app.js:${LineOf('js/app.js', 'import(')}: import('./lazy.js'): ./lazy.js is not in the bundle ` +
        '(resolves to js/lazy.js)',
  ]);
});

test('a missing worker script is caught (fetch and new Worker resolve against the document)', () => {
  ExpectFailure({'worker/w.js': null}, [
    `js/app.js:${LineOf('js/app.js', 'new Worker')}: new Worker(simd ? 'worker/w.js' : \`worker/w.js\`): ` +
        'worker/w.js is not in the bundle',
  ]);
});

test('every branch of a ?: of literals is checked', () => {
  const app = kComplete['js/app.js'].replace('`worker/w.js`', '`worker/w-scalar.js`');
  ExpectFailure({'js/app.js': app}, [
    `js/app.js:${LineOf('js/app.js', 'new Worker')}: new Worker(simd ? 'worker/w.js' : \`worker/w-scalar.js\`): ` +
        'worker/w-scalar.js is not in the bundle',
  ]);
});

test("a missing importScripts target is caught, resolved against the worker's URL", () => {
  ExpectFailure({'worker/lib/extra.js': null}, [
    "worker/lib/helper.js:2: importScripts('lib/extra.js'): lib/extra.js is not in the bundle (resolves to " +
        'worker/lib/extra.js)',
  ]);
  ExpectFailure({'glue/glue.js': null}, [
    "worker/w.js:1: importScripts('../glue/glue.js', 'lib/helper.js'): ../glue/glue.js is not in the bundle " +
        '(resolves to glue/glue.js)',
  ]);
});

test('a missing fetch target is caught, through a const holding the literal', () => {
  ExpectFailure({'models/m.bin': null}, [
    `js/app.js:${LineOf('js/app.js', 'fetch(')}: fetch(kModel): models/m.bin is not in the bundle`,
  ]);
  ExpectFailure({'models/tok.bin': null}, [
    `js/app.js:${LineOf('js/app.js', 'createPreloadedFile')}: FS.createPreloadedFile('/models', 'tok.bin', ` +
        "'models/tok.bin', true, false): models/tok.bin is not in the bundle",
    "worker/lib/helper.js:1: fetch('../models/tok.bin'): ../models/tok.bin is not in the bundle (resolves to " +
        'models/tok.bin)',
  ]);
});

test("a missing .wasm named by Emscripten-like glue is caught, resolved against the worker's URL", () => {
  ExpectFailure({'worker/glue.wasm': null}, [
    `glue/glue.js:${LineOf('glue/glue.js', '"glue.wasm"')}: "glue.wasm": glue.wasm is not in the bundle ` +
        '(resolves to worker/glue.wasm)',
  ]);
  ExpectFailure({'glue/page.wasm': null}, [
    'glue/page-glue.js:2: "page.wasm": page.wasm is not in the bundle (resolves to glue/page.wasm)',
  ]);
});

test('a missing <script src>, stylesheet, image and CSS url() are caught', () => {
  ExpectFailure({'boot.js': null, 'style.css': null, 'logo.png': null}, [
    `index.html:${LineOf('index.html', 'style.css')}: <link href="style.css">: style.css is not in the bundle`,
    `index.html:${LineOf('index.html', 'logo.png')}: <img src="logo.png">: logo.png is not in the bundle`,
    `index.html:${LineOf('index.html', 'boot.js')}: <script src="boot.js">: boot.js is not in the bundle`,
    `js/app.js:${LineOf('js/app.js', 'new URL')}: new URL('../logo.png', import.meta.url): ../logo.png is not in ` +
        'the bundle (resolves to logo.png)',
  ]);
  ExpectFailure({'img/bg.png': null, 'img/dot.png': null}, [
    `index.html:${LineOf('index.html', 'dot.png')}: url('img/dot.png'): img/dot.png is not in the bundle`,
    'style.css:2: url("img/bg.png?v=1#top"): img/bg.png?v=1#top is not in the bundle (resolves to img/bg.png)',
  ]);
});

test('references escaping the bundle fail even when the file exists outside it', () => {
  const app = kComplete['js/app.js'] + "\nfetch('../../outside.bin');\nfetch('/models/m.bin');\n" +
              "import('https://cdn.example.com/x.js');\nfetch('//cdn.example.com/y.bin');\n" +
              "import x from 'lodash';\n";
  fs.writeFileSync(path.join(scratch, 'outside.bin'), 'exists, but not in the bundle');
  const Line = (needle) => LineOf('js/app.js', needle, app);
  ExpectFailure({'js/app.js': app}, [
    `js/app.js:${Line("'../../outside")}: fetch('../../outside.bin'): ../../outside.bin points outside the ` +
        'bundle (resolves to ../outside.bin)',
    `js/app.js:${Line("fetch('/models")}: fetch('/models/m.bin'): /models/m.bin is an absolute path, outside the ` +
        'bundle (it may be served from any folder: use a relative URL)',
    `js/app.js:${Line('https:')}: import('https://cdn.example.com/x.js'): https://cdn.example.com/x.js is ` +
        'outside the bundle (another origin)',
    `js/app.js:${Line("'//cdn")}: fetch('//cdn.example.com/y.bin'): //cdn.example.com/y.bin is outside the ` +
        'bundle (another origin)',
    `js/app.js:${Line('lodash')}: import x from 'lodash';: bare module specifier 'lodash': without an import ` +
        'map a browser cannot resolve it',
  ]);
  const html = kComplete['index.html'].replace('href="style.css"', 'href="../style.css"');
  ExpectFailure({'index.html': html, 'style.css': null}, [
    `index.html:${LineOf('index.html', 'style.css')}: <link href="../style.css">: ../style.css points outside ` +
        'the bundle (resolves to ../style.css)',
  ]);
});

test('a non-literal import(), fetch, Worker or importScripts argument fails as unverifiable', () => {
  const app = kComplete['js/app.js'] + '\nlet name = "./lazy.js";\nname = name + "";\nimport(name);\n' +
              'fetch(`models/${name}`);\nnew Worker(name);\n';
  const worker = kComplete['worker/w.js'] + 'importScripts(self.glue);\n';
  const Line = (needle) => LineOf('js/app.js', needle, app);
  const kWhy = 'non-literal argument: the check cannot verify what it loads (use a string literal, a const ' +
               'holding one, or a ?: of literals)';
  ExpectFailure({'js/app.js': app, 'worker/w.js': worker}, [
    `js/app.js:${Line('import(name)')}: import(name): ${kWhy}`,
    `js/app.js:${Line('fetch(`')}: fetch(\`models/\${name}\`): ${kWhy}`,
    `js/app.js:${Line('new Worker(name)')}: new Worker(name): ${kWhy}`,
    `worker/w.js:2: importScripts(self.glue): ${kWhy}`,
  ]);
});

test("a locateFile override outside the glue fails: it decides where the glue's files come from", () => {
  const app = kComplete['js/app.js'] + '\nconst options = {locateFile: (file) => file};\n';
  ExpectFailure({'js/app.js': app}, [
    `js/app.js:${LineOf('js/app.js', 'locateFile', app)}: locateFile: (file) => file: a locateFile override ` +
        "decides where the Emscripten glue's files are fetched from: the check cannot verify it (let the glue " +
        'find them beside itself)',
  ]);
});

test('a file nothing references is a warning, not a failure', () => {
  const dir = MakeBundle({'stale.js': 'old'});
  const result = Check(dir);
  assert.deepEqual(result.err, [`check_bundle: warning: ${dir}/stale.js: nothing references it`]);
  assert.equal(result.status, 0);
});

test('a missing bundle folder or entry page fails', () => {
  const missing = path.join(scratch, 'no-such-bundle');
  assert.deepEqual(Check(missing).out, [`check_bundle: ${missing}: not a directory (expected the assembled web ` +
                                        'bundle, e.g. build/wasm/web)']);
  const dir = MakeBundle({'index.html': null});
  const result = Check(dir);
  assert.deepEqual(result.out, [`check_bundle: ${dir}: --entry: index.html is not in the bundle`]);
  assert.equal(result.status, 1);
});
