// check_bundle.mjs: the web bundle verifies its own output. Starting from the entry HTML it walks everything
// the page loads (HTML, CSS, classic and module scripts, workers, the Emscripten glue's .wasm, fetched files)
// and fails, naming the referring file:line, when a reference is missing from BUNDLE, points outside it, or
// is dynamic with an argument it cannot verify. A fetch of `new URL(path, location.origin)` is a request to the
// serving origin's own routes (a server's API, as the chat page makes to kvq serve), not a file of the bundle,
// which may be served from any folder: it is not followed. Seed 000's lesson: a copy step that can report success over a
// broken tree is worse than none. Usage: node tools/check_bundle.mjs BUNDLE [--entry index.html] [--list]
// As a module: CheckBundle (below) returns what the command prints, for a caller checking many bundles in one
// process (tests/web/check/real_bundle_test.mjs).
import fs from 'node:fs';
import path from 'node:path';
import {createRequire} from 'node:module';
import {fileURLToPath} from 'node:url';

const kAcornPath = '/usr/share/nodejs/acorn';
// Every file is addressed as a URL under this root, so that '../' escapes and '/abs' paths land outside it
// exactly as a browser would resolve them (the bundle may be served from any folder).
const kRoot = new URL('http://bundle.invalid/__bundle__/');

function Fail(message) {
  console.log(`check_bundle: ${message}`);
  process.exit(1);
}

function LoadAcorn() {
  try {
    return createRequire(import.meta.url)(kAcornPath);
  } catch (error) {
    Fail(`cannot load the JavaScript parser acorn from ${kAcornPath} (${error.code || error.message}); ` +
         'install it with `apt-get install node-acorn`');
  }
}

function ParseArgs(argv) {
  const options = {bundle: null, entry: 'index.html', list: false};
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === '--entry' && i + 1 < argv.length) options.entry = argv[++i];
    else if (argv[i] === '--list') options.list = true;
    else if (!argv[i].startsWith('--') && options.bundle === null) options.bundle = argv[i];
    else Fail(`unexpected argument '${argv[i]}'; usage: check_bundle.mjs BUNDLE [--entry index.html] [--list]`);
  }
  if (options.bundle === null) Fail('usage: check_bundle.mjs BUNDLE [--entry index.html] [--list]');
  return options;
}

// One line of source for a message: whitespace collapsed, at most 90 characters.
function Snippet(text) {
  const line = text.replace(/\s+/g, ' ').trim();
  return line.length > 90 ? line.slice(0, 87) + '...' : line;
}

const kGlobalObjects = new Set(['self', 'window', 'globalThis']);

// callee is `name` or `self.name` / `window.name` / `globalThis.name`.
function IsGlobal(node, name) {
  if (node.type === 'Identifier') return node.name === name;
  return node.type === 'MemberExpression' && !node.computed && node.property.name === name &&
         node.object.type === 'Identifier' && kGlobalObjects.has(node.object.name);
}

function IsImportMetaUrl(node) {
  return node.type === 'MemberExpression' && !node.computed && node.property.name === 'url' &&
         node.object.type === 'MetaProperty' && node.object.meta.name === 'import';
}

// new URL(x, location.origin) (or self./window./globalThis.location.origin): a route of the serving origin.
function IsOriginRoute(node) {
  if (!node || node.type !== 'NewExpression' || !IsGlobal(node.callee, 'URL') || node.arguments.length !== 2) return false;
  const base = node.arguments[1];
  if (base.type !== 'MemberExpression' || base.computed || base.property.name !== 'origin') return false;
  const object = base.object;
  return (object.type === 'Identifier' && object.name === 'location') ||
         (object.type === 'MemberExpression' && !object.computed && object.property.name === 'location' &&
          object.object.type === 'Identifier' && kGlobalObjects.has(object.object.name));
}

// location.href, self.location(.href), document.baseURI, document.URL: the global scope's base URL.
function IsGlobalBase(node) {
  if (node.type === 'Identifier') return node.name === 'location';
  if (node.type !== 'MemberExpression' || node.computed) return false;
  const object = node.object;
  const name = node.property.name;
  if (object.type === 'Identifier' && object.name === 'document') return name === 'baseURI' || name === 'URL';
  if (name === 'location') return object.type === 'Identifier' && kGlobalObjects.has(object.name);
  return name === 'href' && IsGlobalBase(object);
}

// Names bound exactly once in the file (a const/let/var with an initialiser, never assigned again): a
// reference through such a name is as verifiable as the literal it holds.
function CollectBindings(ast, Walk) {
  const count = new Map();     // name -> number of bindings and assignments
  const init = new Map();      // name -> initialiser node
  const Bind = (pattern) => {
    if (!pattern) return;
    if (pattern.type === 'Identifier') count.set(pattern.name, (count.get(pattern.name) || 0) + 1);
    else if (pattern.type === 'ObjectPattern') pattern.properties.forEach((p) => Bind(p.value || p.argument));
    else if (pattern.type === 'ArrayPattern') pattern.elements.forEach(Bind);
    else if (pattern.type === 'RestElement') Bind(pattern.argument);
    else if (pattern.type === 'AssignmentPattern') Bind(pattern.left);
  };
  Walk(ast, (node) => {
    if (node.type === 'VariableDeclarator') {
      Bind(node.id);
      if (node.id.type === 'Identifier' && node.init) init.set(node.id.name, node.init);
    } else if (/Function/.test(node.type)) {
      if (node.id) Bind(node.id);
      node.params.forEach(Bind);
    } else if (node.type === 'ClassDeclaration' && node.id) Bind(node.id);
    else if (node.type === 'CatchClause') Bind(node.param);
    else if (node.type === 'AssignmentExpression') Bind(node.left);
    else if (node.type === 'UpdateExpression') Bind(node.argument);
    else if (/^Import(Default|Namespace)?Specifier$/.test(node.type)) Bind(node.local);
  });
  const single = new Map();
  for (const [name, node] of init) if (count.get(name) === 1) single.set(name, node);
  return single;
}

// ---- HTML and CSS: a small tokenizer, enough to find every URL a page loads (no DOM needed) ----

// Line number (1-based) of an offset: binary search over the offsets where lines start.
function LineIndex(text, first_line = 1) {
  const starts = [0];
  for (let i = text.indexOf('\n'); i >= 0; i = text.indexOf('\n', i + 1)) starts.push(i + 1);
  return (offset) => {
    let lo = 0;
    let hi = starts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (starts[mid] <= offset) lo = mid;
      else hi = mid - 1;
    }
    return first_line + lo;
  };
}

function DecodeEntities(value) {
  const named = {amp: '&', quot: '"', apos: "'", lt: '<', gt: '>'};
  return value.replace(/&(#x[0-9a-f]+|#[0-9]+|[a-z]+);/gi, (all, name) => {
    if (name[0] === '#') {
      return String.fromCodePoint(name[1] === 'x' || name[1] === 'X' ? parseInt(name.slice(2), 16)
                                                                     : parseInt(name.slice(1), 10));
    }
    return named[name.toLowerCase()] ?? all;
  });
}

// url() and @import in a style sheet (comments blanked first, keeping line breaks).
function ScanCss(text, first_line) {
  const clean = text.replace(/\/\*[\s\S]*?\*\//g, (comment) => comment.replace(/[^\n]/g, ' '));
  const Line = LineIndex(clean, first_line);
  const found = [];
  const pattern = /@import\s+(?:url\(\s*)?(["']?)([^"')\s;]+)\1\s*\)?|url\(\s*(["']?)([^"')]*?)\3\s*\)/gi;
  for (const match of clean.matchAll(pattern)) {
    const imported = match[2] !== undefined;
    found.push({url: DecodeEntities(imported ? match[2] : match[4]).trim(), line: Line(match.index),
                what: Snippet(match[0]), imported});
  }
  return found;
}

const kJsTypes = new Set(['', 'text/javascript', 'application/javascript', 'text/ecmascript',
                          'application/ecmascript', 'module']);
// Element -> attributes holding a URL the page loads, and how the target is loaded.
const kUrlAttributes = {
  img: {src: 'file', srcset: 'srcset'}, source: {src: 'file', srcset: 'srcset'}, video: {src: 'file', poster: 'file'},
  audio: {src: 'file'}, track: {src: 'file'}, embed: {src: 'file'}, object: {data: 'file'}, input: {src: 'file'},
  iframe: {src: 'html'}, frame: {src: 'html'}, a: {href: 'link'}, area: {href: 'link'},
  image: {'href': 'file', 'xlink:href': 'file'}, use: {'href': 'file', 'xlink:href': 'file'},
};

// Every URL-bearing attribute, inline script and style of an HTML document, in order.
function ScanHtml(text) {
  const Line = LineIndex(text);
  const lower = text.toLowerCase();
  const items = [];
  let i = 0;
  while (i < text.length) {
    const lt = text.indexOf('<', i);
    if (lt < 0) break;
    if (text.startsWith('<!--', lt)) {
      const end = text.indexOf('-->', lt + 4);
      i = end < 0 ? text.length : end + 3;
      continue;
    }
    const name_match = /^<([a-zA-Z][a-zA-Z0-9:-]*)/.exec(text.slice(lt, lt + 64));
    if (!name_match) {
      const end = text.indexOf('>', lt);
      i = /^<[!?/]/.test(text.slice(lt, lt + 2)) && end >= 0 ? end + 1 : lt + 1;
      continue;
    }
    const tag = name_match[1].toLowerCase();
    const attributes = new Map();   // name -> {value, offset}
    let p = lt + name_match[0].length;
    while (p < text.length) {
      const attribute = /^\s*(\/?>|([^\s"'>\/=]+)(\s*=\s*("([^"]*)"|'([^']*)'|([^\s>]*)))?|\/)/.exec(
          text.slice(p, p + 100000));
      if (!attribute || attribute[0].length === 0) { ++p; continue; }
      p += attribute[0].length;
      if (attribute[1].endsWith('>')) break;
      if (attribute[2]) {
        const value = attribute[5] ?? attribute[6] ?? attribute[7] ?? '';
        attributes.set(attribute[2].toLowerCase(), {value: DecodeEntities(value), offset: p - attribute[0].length});
      }
    }
    i = p;
    const Item = (kind, name, fields = {}) => {
      const attribute = attributes.get(name);
      items.push({kind, url: attribute.value.trim(), line: Line(attribute.offset),
                  what: Snippet(`<${tag} ${name}="${attribute.value}">`), ...fields});
    };
    if (tag === 'script' || tag === 'style') {
      const close = lower.indexOf(`</${tag}`, i);
      const body_end = close < 0 ? text.length : close;
      const body = text.slice(i, body_end);
      const body_line = Line(i);
      i = close < 0 ? text.length : lower.indexOf('>', close) + 1 || text.length;
      if (tag === 'style') {
        items.push({kind: 'style', code: body, line: body_line});
        continue;
      }
      const type = (attributes.get('type')?.value ?? '').trim().toLowerCase();
      if (type === 'importmap') {
        items.push({kind: 'problem', line: Line(lt), what: '<script type="importmap">',
                    reason: 'import maps are not supported by the check: use relative module specifiers'});
      } else if (kJsTypes.has(type)) {
        if (attributes.has('src')) Item(type === 'module' ? 'module' : 'classic', 'src');
        else items.push({kind: 'script', code: body, line: body_line, module: type === 'module'});
      }
      continue;
    }
    if (attributes.has('style')) {
      const attribute = attributes.get('style');
      items.push({kind: 'style', code: attribute.value, line: Line(attribute.offset)});
    }
    if (tag === 'base' && attributes.has('href')) {
      items.push({kind: 'problem', line: Line(lt), what: Snippet(`<base href="${attributes.get('href').value}">`),
                  reason: '<base> changes how every URL resolves: not supported by the check'});
    } else if (tag === 'link' && attributes.has('href')) {
      const rel = (attributes.get('rel')?.value ?? '').toLowerCase().split(/\s+/);
      Item(rel.includes('stylesheet') ? 'css' : rel.includes('modulepreload') ? 'module' : 'file', 'href');
    }
    for (const [name, how] of Object.entries(kUrlAttributes[tag] ?? {})) {
      if (!attributes.has(name)) continue;
      if (how !== 'srcset') {
        Item(how, name);
        continue;
      }
      const attribute = attributes.get(name);
      for (const candidate of attribute.value.split(',')) {
        const url = candidate.trim().split(/\s+/)[0];
        if (url) {
          items.push({kind: 'file', url, line: Line(attribute.offset),
                      what: Snippet(`<${tag} ${name}="${attribute.value}">`)});
        }
      }
    }
  }
  return items;
}

// ---- The walk ----

class Checker {
  // trees: a script's source type and text -> {tree} or {error} from acorn (a tree is only read), shared
  // by the checks of one process so that a file unchanged between them is parsed once.
  constructor(bundle, acorn, trees) {
    this.bundle = bundle;           // as given on the command line, for messages
    this.acorn = acorn;
    this.trees = trees;
    this.real_root = fs.realpathSync(bundle);
    this.problems = [];             // one line each
    this.reached = new Map();       // bundle-relative path -> how it is loaded (html, module, classic, css, file)
    this.queue = [];                // [{rel, how, global_base}] still to read
    this.seen = new Set();          // rel|how|global_base already queued
    this.parsed = new Map();        // rel|first line|source type -> syntax tree, or null after a parse error
  }

  Display(rel) { return path.join(this.bundle, rel); }
  Problem(from, line, what, reason) {
    const problem = `${this.Display(from)}:${line}: ${what}: ${reason}`;
    if (!this.problems.includes(problem)) this.problems.push(problem);
  }

  // Resolves `raw` against `base` (a URL under kRoot); returns the bundle-relative path or reports why not.
  Resolve(from, line, what, raw, base, {module_specifier = false, navigation = false} = {}) {
    if (/^(data|blob|about|javascript):/i.test(raw) || raw.startsWith('#') || raw === '') return null;
    const scheme = /^[a-z][a-z0-9+.-]*:/i.test(raw);
    if (navigation && (scheme || raw.startsWith('//'))) return null;  // a link the user may follow, not a load
    if (scheme || raw.startsWith('//')) {
      this.Problem(from, line, what, `${raw} is outside the bundle (another origin)`);
      return null;
    }
    if (raw.startsWith('/')) {
      this.Problem(from, line, what, `${raw} is an absolute path, outside the bundle (it may be served from ` +
                   'any folder: use a relative URL)');
      return null;
    }
    if (module_specifier && !/^\.\.?\//.test(raw)) {
      this.Problem(from, line, what, `bare module specifier '${raw}': without an import map a browser ` +
                   'cannot resolve it');
      return null;
    }
    const url = new URL(raw, base);
    if (url.origin !== kRoot.origin || !url.pathname.startsWith(kRoot.pathname)) {
      const shown = url.origin === kRoot.origin ? path.posix.relative(kRoot.pathname, url.pathname) : url.href;
      this.Problem(from, line, what, `${raw} points outside the bundle (resolves to ${shown})`);
      return null;
    }
    let rel = decodeURIComponent(url.pathname.slice(kRoot.pathname.length));
    if (rel === '' || rel.endsWith('/')) rel += 'index.html';
    const file = path.join(this.real_root, rel);
    let real = null;
    try {
      if (fs.statSync(file).isFile()) real = fs.realpathSync(file);
    } catch { /* missing: reported below */ }
    if (real === null) {
      const shown = path.posix.normalize(raw) === rel ? '' : ` (resolves to ${rel})`;
      this.Problem(from, line, what, `${raw} is not in the bundle${shown}`);
      return null;
    }
    if (!real.startsWith(this.real_root + path.sep)) {
      this.Problem(from, line, what, `${raw} is a link to ${real}, outside the bundle`);
      return null;
    }
    return rel;
  }

  // Records that `rel` is loaded as `how`; HTML, CSS and scripts are read in turn.
  Reach(rel, how, global_base) {
    if (rel === null) return;
    const previous = this.reached.get(rel);
    if (!previous || previous === 'file') this.reached.set(rel, how);
    const key = `${rel}|${how}|${global_base ? global_base.href : ''}`;
    if (how === 'file' || this.seen.has(key)) return;
    this.seen.add(key);
    this.queue.push({rel, how, global_base});
  }

  Run(entry) {
    let rel = null;
    try {
      const normal = path.posix.normalize(entry);
      if (!normal.startsWith('../') && fs.statSync(path.join(this.real_root, normal)).isFile()) rel = normal;
    } catch { /* reported below */ }
    if (rel === null) this.problems.push(`${this.bundle}: --entry: ${entry} is not in the bundle`);
    else this.Reach(rel, 'html', null);
    while (this.queue.length > 0) {
      const item = this.queue.shift();
      const text = fs.readFileSync(path.join(this.real_root, item.rel), 'utf8');
      if (item.how === 'html') this.Html(item.rel, text);
      else if (item.how === 'css') this.Css(item.rel, text, 1, new URL(item.rel, kRoot));
      else this.Script(item.rel, text, 1, item.how, item.global_base, new URL(item.rel, kRoot));
    }
  }

  Html(rel, text) {
    const document_url = new URL(rel, kRoot);
    for (const item of ScanHtml(text)) {
      const what = item.what;
      if (item.kind === 'problem') this.Problem(rel, item.line, what, item.reason);
      else if (item.kind === 'script') {
        this.Script(rel, item.code, item.line, item.module ? 'module' : 'classic', document_url, document_url);
      } else if (item.kind === 'style') {
        this.Css(rel, item.code, item.line, document_url);
      } else {
        const target = this.Resolve(rel, item.line, what, item.url, document_url,
                                    {navigation: item.kind === 'link'});
        let how = item.kind === 'link' ? 'file' : item.kind;
        if (target !== null && /\.html?$/i.test(target) && (item.kind === 'link' || item.kind === 'file')) {
          how = 'html';
        }
        this.Reach(target, how, document_url);
      }
    }
  }

  Css(rel, text, first_line, base) {
    for (const item of ScanCss(text, first_line)) {
      const target = this.Resolve(rel, item.line, item.what, item.url, base);
      this.Reach(target, /\.css$/i.test(item.url.replace(/[?#].*/, '')) && item.imported ? 'css' : 'file', null);
    }
  }

  // The syntax tree, parsed once per file (or inline script) and source type; null after a parse error,
  // which is reported the first time only.
  Parse(rel, code, first_line, how) {
    const source_type = how === 'module' || how === 'worker-module' ? 'module' : 'script';
    const key = `${rel}|${first_line}|${source_type}`;
    if (!this.parsed.has(key)) {
      const text_key = `${source_type}|${code}`;
      if (!this.trees.has(text_key)) {
        try {
          this.trees.set(text_key, {tree: this.acorn.parse(code, {ecmaVersion: 'latest', sourceType: source_type,
                                                                  locations: true, allowHashBang: true})});
        } catch (error) {
          this.trees.set(text_key, {error});
        }
      }
      const {tree, error} = this.trees.get(text_key);
      this.parsed.set(key, tree ?? null);
      if (error) {
        const line = first_line - 1 + (error.loc ? error.loc.line : 1);
        this.Problem(rel, line, 'script', `cannot parse as a ${how} script: ${error.message}`);
      }
    }
    return this.parsed.get(key);
  }

  // `how`: module, classic, worker-module or worker-classic. script_url: the file's own URL (static import,
  // import(), import.meta.url); global_base: the document's or the worker's URL (fetch, importScripts,
  // new Worker, XHR resolve against it).
  Script(rel, code, first_line, how, global_base, script_url) {
    const ast = this.Parse(rel, code, first_line, how);
    if (ast === null) return;
    const in_worker = how.startsWith('worker');
    const module_how = in_worker ? 'worker-module' : 'module';  // how its imports are loaded
    const Walk = (node, Visit) => {
      const stack = [node];
      while (stack.length > 0) {
        const current = stack.pop();
        if (Visit(current) === false) continue;
        for (const key in current) {
          if (key === 'loc') continue;
          const value = current[key];
          if (Array.isArray(value)) {
            for (let i = value.length - 1; i >= 0; --i) if (value[i] && value[i].type) stack.push(value[i]);
          } else if (value && typeof value.type === 'string') stack.push(value);
        }
      }
    };
    const bindings = CollectBindings(ast, Walk);
    // Emscripten glue declares `function locateFile` (3.1.6 and later): it names its .wasm as a string literal,
    // checked below, and its own loaders (fetch, XHR, importScripts of what locateFile returns) take variables.
    let glue = false;
    Walk(ast, (node) => {
      if (node.type === 'FunctionDeclaration' && node.id.name === 'locateFile') glue = true;
    });
    const Line = (node) => first_line - 1 + node.loc.start.line;
    const What = (node) => Snippet(code.slice(node.start, node.end));
    const consumed = new Set();   // string literals and new URL(...) already handled as a loader's argument

    // The possible values of an argument, each {raw, base}, or null when it is not statically known.
    const Values = (node, base, depth = 0) => {
      if (depth > 8 || !node) return null;
      consumed.add(node);
      if (node.type === 'Literal' && typeof node.value === 'string') return [{raw: node.value, base}];
      if (node.type === 'TemplateLiteral' && node.expressions.length === 0) {
        return [{raw: node.quasis[0].value.cooked, base}];
      }
      if (node.type === 'ConditionalExpression') {
        const a = Values(node.consequent, base, depth + 1);
        const b = Values(node.alternate, base, depth + 1);
        return a && b ? a.concat(b) : null;
      }
      if (node.type === 'BinaryExpression' && node.operator === '+') {
        const a = Values(node.left, base, depth + 1);
        const b = Values(node.right, base, depth + 1);
        if (!a || !b || a.length * b.length > 64) return null;
        return a.flatMap((x) => b.map((y) => ({raw: x.raw + y.raw, base})));
      }
      if (node.type === 'Identifier' && bindings.has(node.name)) {
        return Values(bindings.get(node.name), base, depth + 1);
      }
      if (node.type === 'NewExpression' && IsGlobal(node.callee, 'Request')) {
        return Values(node.arguments[0], base, depth + 1);
      }
      if (node.type === 'NewExpression' && IsGlobal(node.callee, 'URL')) {
        // new URL(x, import.meta.url): x against this file; against location/document.baseURI: against the
        // global base; without a base x must be absolute (and is then checked as such).
        const [first, second] = node.arguments;
        const url_base = !second ? base : IsImportMetaUrl(second) ? script_url : IsGlobalBase(second) ? global_base
                                                                                                     : null;
        const values = url_base && Values(first, url_base, depth + 1);
        if (!values || (!second && !values.every((v) => /^[a-z][a-z0-9+.-]*:/i.test(v.raw)))) return null;
        return values;
      }
      return null;
    };

    // A loader call: every possible argument value is checked, or the call is reported as unverifiable.
    // new_global: the target starts a global scope of its own (a worker), its URL the base of its loads.
    const Load = (node, arg, base, how_loaded, options = {}) => {
      const values = Values(arg, base);
      if (values === null) {
        if (glue && !options.module_specifier) return;  // the glue's own loader: its names are its literals
        this.Problem(rel, Line(node), What(node), 'non-literal argument: the check cannot verify what it ' +
                     'loads (use a string literal, a const holding one, or a ?: of literals)');
        return;
      }
      for (const value of values) {
        const target = this.Resolve(rel, Line(node), What(node), value.raw, value.base, options);
        if (target !== null) {
          this.Reach(target, how_loaded, options.new_global ? new URL(target, kRoot) : global_base);
        }
      }
    };
    const WorkerKind = (options) => {
      const type = options?.type === 'ObjectExpression' &&
                   options.properties.find((p) => p.key && (p.key.name || p.key.value) === 'type');
      return type && type.value?.value === 'module' ? 'worker-module' : 'worker-classic';
    };

    Walk(ast, (node) => {
      if ((node.type === 'ImportDeclaration' || node.type === 'ExportAllDeclaration' ||
           node.type === 'ExportNamedDeclaration') && node.source) {
        consumed.add(node.source);
        const target = this.Resolve(rel, Line(node), What(node), node.source.value, script_url,
                                    {module_specifier: true});
        this.Reach(target, module_how, global_base);
      } else if (node.type === 'ImportExpression') {
        Load(node, node.source, script_url, module_how, {module_specifier: true});
      } else if (node.type === 'CallExpression' && IsGlobal(node.callee, 'importScripts')) {
        for (const arg of node.arguments) Load(node, arg, global_base, 'worker-classic');
      } else if (node.type === 'CallExpression' && IsGlobal(node.callee, 'fetch')) {
        if (IsOriginRoute(node.arguments[0])) consumed.add(node.arguments[0]);  // the server's route, not a file
        else Load(node, node.arguments[0], global_base, 'file');
      } else if (node.type === 'NewExpression' &&
                 (IsGlobal(node.callee, 'Worker') || IsGlobal(node.callee, 'SharedWorker'))) {
        Load(node, node.arguments[0], global_base, WorkerKind(node.arguments[1]), {new_global: true});
      } else if (node.type === 'CallExpression' && node.callee.type === 'MemberExpression' &&
                 node.callee.property.name === 'register' && node.callee.object.type === 'MemberExpression' &&
                 node.callee.object.property.name === 'serviceWorker') {
        Load(node, node.arguments[0], global_base, WorkerKind(node.arguments[1]), {new_global: true});
      } else if (node.type === 'CallExpression' && node.callee.type === 'MemberExpression' &&
                 /^create(Preloaded|Lazy)File$/.test(node.callee.property.name)) {
        Load(node, node.arguments[2], global_base, 'file');  // Emscripten FS.createPreloadedFile(dir, name, url)
      } else if (node.type === 'CallExpression' && node.callee.type === 'MemberExpression' &&
                 node.callee.property.name === 'open' && node.arguments.length >= 2 &&
                 node.arguments[0].type === 'Literal' && /^(GET|POST|HEAD)$/i.test(node.arguments[0].value)) {
        Load(node, node.arguments[1], global_base, 'file');  // XMLHttpRequest.open(method, url)
      } else if (node.type === 'CallExpression' && glue && node.callee.type === 'Identifier' &&
                 node.callee.name === 'locateFile' && node.arguments[0]?.type === 'Literal') {
        Load(node, node.arguments[0], in_worker ? global_base : script_url, 'file');
      } else if (node.type === 'NewExpression' && IsGlobal(node.callee, 'URL') && !consumed.has(node) &&
                 node.arguments[1] && IsImportMetaUrl(node.arguments[1])) {
        Load(node, node, script_url, 'file');  // new URL('x', import.meta.url) names a file of the bundle
      } else if (!glue && (node.type === 'Property' || node.type === 'MemberExpression') &&
                 ((node.key || node.property)?.name === 'locateFile' ||
                  (node.key || node.property)?.value === 'locateFile')) {
        this.Problem(rel, Line(node), What(node), "a locateFile override decides where the Emscripten glue's " +
                     'files are fetched from: the check cannot verify it (let the glue find them beside itself)');
      } else if (node.type === 'Literal' && typeof node.value === 'string' && /\.wasm$/i.test(node.value) &&
                 !consumed.has(node)) {
        // Emscripten's glue names its .wasm as a literal and fetches it relative to its own URL on a page and
        // to the worker's URL in a worker (scriptDirectory); elsewhere such a literal goes to fetch.
        const base = glue && !in_worker ? script_url : global_base;
        this.Reach(this.Resolve(rel, Line(node), Snippet(JSON.stringify(node.value)), node.value, base), 'file',
                   global_base);
      }
    });
  }
}

let acorn = null;  // loaded on the first check
const kSharedTrees = new Map();

// The check of `bundle` from `entry`: {status (0 or 1), out, err}, the lines the command prints to stdout and
// stderr. `list`: also the reached files, as --list prints them.
export function CheckBundle(bundle, {entry = 'index.html', list = false} = {}) {
  const out = [], err = [];
  let is_dir = false;
  try {
    is_dir = fs.statSync(bundle).isDirectory();
  } catch { /* reported below */ }
  if (!is_dir) {
    return {status: 1, out: [`check_bundle: ${bundle}: not a directory (expected the assembled web bundle, e.g. ` +
                             'build/wasm/web)'], err};
  }
  acorn ??= LoadAcorn();
  const checker = new Checker(bundle, acorn, kSharedTrees);
  checker.Run(entry);

  // Files of the bundle that nothing reached: a warning (a stale leftover, or a reference the walk missed).
  const all = [];
  const List = (dir) => {
    for (const item of fs.readdirSync(path.join(checker.real_root, dir), {withFileTypes: true})) {
      const rel = path.posix.join(dir, item.name);
      if (item.isDirectory()) List(rel);
      else all.push(rel);
    }
  };
  List('');
  for (const rel of all.sort()) {
    if (checker.reached.size > 0 && !checker.reached.has(rel)) err.push(`check_bundle: warning: ${checker.Display(rel)}: nothing references it`);
  }
  if (list) {
    for (const [rel, how] of [...checker.reached].sort()) out.push(`reached ${how} ${rel}`);
  }
  if (checker.problems.length > 0) {
    for (const problem of checker.problems) out.push(`check_bundle: ${problem}`);
    return {status: 1, out, err};
  }
  out.push(`check_bundle: ${bundle}: ${checker.reached.size} files reached from ${entry}, all present`);
  return {status: 0, out, err};
}

// Run as a command (not imported): node check_bundle.mjs ...
const RunAsCommand = () => {
  try {
    return fs.realpathSync(process.argv[1]) === fileURLToPath(import.meta.url);
  } catch {
    return false;
  }
};
if (RunAsCommand()) {
  const options = ParseArgs(process.argv.slice(2));
  const result = CheckBundle(options.bundle, options);
  for (const line of result.err) console.error(line);
  for (const line of result.out) console.log(line);
  process.exit(result.status);
}
