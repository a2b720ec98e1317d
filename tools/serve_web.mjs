// serve_web.mjs: a static server for the web bundle that sends the cross-origin isolation headers
// (COOP same-origin, COEP require-corp) a browser wants before it offers SharedArrayBuffer, which
// the page's threaded build needs; Python's http.server cannot send them, and `kvq serve --web`
// needs a model of its own. Serves one folder's files only, on 127.0.0.1 unless told otherwise.
// Usage: node tools/serve_web.mjs [DIR (default build/wasm/web)] [--port N (default 8000)]
//        [--host H] [--no-isolation (leave the headers out: the page then runs its one-thread build)]
// The browser tests (tests/web/browser/) import ServeStatic from here.
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

const kMime = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8', '.wasm': 'application/wasm',
  '.json': 'application/json', '.bin': 'application/octet-stream', '.gguf': 'application/octet-stream',
  '.png': 'image/png', '.svg': 'image/svg+xml', '.txt': 'text/plain; charset=utf-8',
};

export const kIsolationHeaders = {'Cross-Origin-Opener-Policy': 'same-origin',
                                  'Cross-Origin-Embedder-Policy': 'require-corp'};

// Serves root's files on host:port (0: any free port). on_refusal(method, url, code, why) hears of
// every request refused (a test fails on them). Resolves to the listening http.Server.
export function ServeStatic(root, {host = '127.0.0.1', port = 0, isolation = true, on_refusal = () => {}} = {}) {
  const real_root = fs.realpathSync(root);
  const server = http.createServer((req, res) => {
    const reply = (code, why) => {
      on_refusal(req.method, req.url, code, why);
      res.writeHead(code, {'Content-Type': 'text/plain; charset=utf-8'});
      res.end(`${code} ${why}\n`);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return reply(405, 'only GET and HEAD');
    // The browser asks for a favicon on its own; the page has none and needs none.
    if (req.url === '/favicon.ico') return res.writeHead(204).end();
    let rel;
    try {
      rel = decodeURIComponent(new URL(req.url, 'http://127.0.0.1').pathname);
    } catch (e) {
      return reply(400, 'bad URL');
    }
    if (rel.endsWith('/')) rel += 'index.html';
    let file;
    try {
      file = fs.realpathSync(path.join(real_root, path.normalize(rel)));
    } catch (e) {
      return reply(404, 'not in the folder');
    }
    if (!file.startsWith(real_root + path.sep) || !fs.statSync(file).isFile()) return reply(404, 'not in the folder');
    const mime = kMime[path.extname(file).toLowerCase()];
    if (!mime) return reply(415, `no MIME type known for ${path.extname(file) || 'a file without extension'}`);
    res.writeHead(200, {'Content-Type': mime, 'Content-Length': fs.statSync(file).size, 'Cache-Control': 'no-store',
                        ...(isolation ? kIsolationHeaders : {})});
    if (req.method === 'HEAD') return res.end();
    fs.createReadStream(file).pipe(res);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve(server));
  });
}

if (process.argv[1] && fs.realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  const options = {port: 8000, isolation: true};
  let dir = null;
  for (let i = 0; i < args.length; ++i) {
    if (args[i] === '--port' && i + 1 < args.length) options.port = Number(args[++i]);
    else if (args[i] === '--host' && i + 1 < args.length) options.host = args[++i];
    else if (args[i] === '--no-isolation') options.isolation = false;
    else if (!args[i].startsWith('--') && dir === null) dir = args[i];
    else {
      console.error(`serve_web: unexpected argument '${args[i]}'; usage: serve_web.mjs [DIR] [--port N] [--host H] [--no-isolation]`);
      process.exit(2);
    }
  }
  dir ??= 'build/wasm/web';
  if (!Number.isInteger(options.port) || options.port < 0 || options.port > 65535) {
    console.error(`serve_web: --port ${options.port}: expected a port number 0..65535`);
    process.exit(2);
  }
  if (!fs.existsSync(path.join(dir, 'index.html'))) {
    console.error(`serve_web: ${dir} has no index.html (build the web bundle, or name its folder)`);
    process.exit(2);
  }
  options.on_refusal = (method, url, code, why) => console.log(`serve_web: ${method} ${url}: ${code} ${why}`);
  const server = await ServeStatic(dir, options).catch((e) => {
    console.error(`serve_web: cannot listen on ${options.host ?? '127.0.0.1'}:${options.port}: ${e.message}`);
    process.exit(1);
  });
  const {address, port} = server.address();
  console.log(`serve_web: ${dir} at http://${address}:${port}/index.html` +
              (options.isolation ? ' (cross-origin isolated: the page can use every core)' : ' (no isolation headers)'));
}
