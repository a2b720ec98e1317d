// Compute pipelines shared by everything on one GPUDevice that compiles the same WGSL entry point:
// a step program's kernels (the same model's runners, a sequence's resident cache built anew for
// each sequence, a test's several runners on one device) and a resident cache's per-layer KV
// encoders (one shader per format and shape, whatever the layer). A pipeline is immutable and its
// 'auto' layout a function of its WGSL, so one made for one object serves another with the same
// bits; compiling WGSL is the slow part of a runner's start on a software adapter (SwiftShader
// builds every pipeline on the CPU). Keyed by the device (a new device after a lost one compiles
// anew) and by the whole WGSL text and entry point (never by a name that could collide).

// GPUDevice -> {modules: Map(code -> {module, checked}), pipelines: Map(key -> {pipeline, pending}),
// made: Map(make -> Promise)}
const kByDevice = new WeakMap();

function CacheOf(device) {
  let cache = kByDevice.get(device);
  if (!cache) kByDevice.set(device, cache = {modules: new Map(), pipelines: new Map(), made: new Map()});
  return cache;
}

/**
 * What `make(device)` resolves to (pipelines a module compiles its own way: the sampler's
 * CompileSampler), made once per device and function and shared by every later caller; a
 * rejected make is not kept (the next caller tries again).
 */
export function SharedOnDevice(device, make) {
  const cache = CacheOf(device);
  let made = cache.made.get(make);
  if (!made) {
    cache.made.set(make, made = make(device));
    made.catch(() => cache.made.delete(make));
  }
  return made;
}

function ModuleOf(cache, device, code) {
  let m = cache.modules.get(code);
  if (!m) cache.modules.set(code, m = {module: device.createShaderModule({code}), checked: null});
  return m;
}

/**
 * The pipeline of `entry` in `code` on `device`, made with createComputePipeline (synchronous) the
 * first time and shared after. Compilation errors surface as WebGPU validation errors, as for an
 * uncached createComputePipeline.
 */
export function CachedPipeline(device, code, entry) {
  const cache = CacheOf(device);
  const key = `${entry}\n${code}`;
  const hit = cache.pipelines.get(key);
  if (hit?.pipeline) return hit.pipeline;
  const pipeline = device.createComputePipeline({layout: 'auto', compute: {module: ModuleOf(cache, device, code).module, entryPoint: entry}});
  cache.pipelines.set(key, {pipeline, pending: null});
  return pipeline;
}

/**
 * {entry: GPUComputePipeline} for `entries` of `code` on `device`, made with
 * createComputePipelineAsync the first time and shared after (a second caller while the first
 * compiles waits for the same pipeline). Throws, naming `what` and the lines, when the WGSL has
 * compilation errors (checked once per shader).
 */
export async function CachedPipelines(device, code, entries, what) {
  const cache = CacheOf(device);
  const m = ModuleOf(cache, device, code);
  m.checked ??= m.module.getCompilationInfo().then((info) => {
    const errors = info.messages.filter((e) => e.type === 'error');
    return errors.length ? `${what} WGSL: ${errors.map((e) => `${e.lineNum}: ${e.message}`).join('; ')}` : '';
  });
  const error = await m.checked;
  if (error) throw new Error(error);
  // Every entry's compile asked for before any is awaited: the adapter may build them side by side.
  const pending = entries.map((entry) => {
    const key = `${entry}\n${code}`;
    let hit = cache.pipelines.get(key);
    if (!hit) {
      hit = {pipeline: null, pending: device.createComputePipelineAsync({layout: 'auto', compute: {module: m.module, entryPoint: entry}})};
      cache.pipelines.set(key, hit);
      hit.pending.then((p) => { hit.pipeline = p; }, () => cache.pipelines.delete(key));
    }
    return hit.pipeline ?? hit.pending;
  });
  const made = await Promise.all(pending);
  return Object.fromEntries(entries.map((entry, i) => [entry, made[i]]));
}
