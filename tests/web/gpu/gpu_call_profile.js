// Where a WebGPU test's time goes: injected before the page's scripts when gpu_attention_test.mjs
// runs with KVQ_GPU_PROFILE=1 (a profile, not a check: nothing here is asserted). Wraps the
// device calls that cost on a software adapter and sums their wall time: pipeline creation (the
// async ones' compile is awaited here; a synchronous createComputePipeline returns at once and its
// compile lands in the next submit's mapAsync), mapAsync (the GPU's work and the wait for it),
// submits, buffer writes; and counts shader modules and pipelines against the distinct WGSL texts
// and entry points among them (a repeat is a compile that could have been shared). Sums of
// overlapping awaits (pipelines compiled side by side) count each wait in full.
(() => {
  if (typeof GPUDevice === 'undefined') return;
  const P = window.__gpu_profile = {ms: {}, n: {}, sources: new Map(), pipelines: new Map()};
  const Add = (k, ms) => {
    P.ms[k] = (P.ms[k] || 0) + ms;
    P.n[k] = (P.n[k] || 0) + 1;
  };
  const Timed = (proto, name, before = null) => {
    const f = proto[name];
    proto[name] = function (...a) {
      if (before) before(a);
      const t = performance.now();
      const r = f.apply(this, a);
      if (r instanceof Promise) return r.finally(() => Add(name, performance.now() - t));
      Add(name, performance.now() - t);
      return r;
    };
  };
  const code_of = new WeakMap();  // GPUShaderModule -> its WGSL
  const make_module = GPUDevice.prototype.createShaderModule;
  GPUDevice.prototype.createShaderModule = function (d) {
    const t = performance.now();
    const m = make_module.call(this, d);
    Add('createShaderModule', performance.now() - t);
    P.sources.set(d.code, (P.sources.get(d.code) || 0) + 1);
    code_of.set(m, d.code);
    return m;
  };
  // A pipeline by its entry point and its module's WGSL (the text itself as the key).
  const Note = ([d]) => {
    const key = `${d.compute.entryPoint}\n${code_of.get(d.compute.module) ?? '?'}`;
    P.pipelines.set(key, (P.pipelines.get(key) || 0) + 1);
  };
  Timed(GPUDevice.prototype, 'createComputePipeline', Note);
  Timed(GPUDevice.prototype, 'createComputePipelineAsync', Note);
  Timed(GPUDevice.prototype, 'createBuffer');
  Timed(GPUDevice.prototype, 'createBindGroup');
  Timed(GPUShaderModule.prototype, 'getCompilationInfo');
  Timed(GPUBuffer.prototype, 'mapAsync');
  Timed(GPUQueue.prototype, 'onSubmittedWorkDone');
  Timed(GPUQueue.prototype, 'submit');
  Timed(GPUQueue.prototype, 'writeBuffer');
  Timed(GPUAdapter.prototype, 'requestDevice');
  const Sum = (m) => [...m.values()].reduce((a, b) => a + b, 0);
  window.__gpu_profile_report = () => {
    const out = {};
    for (const k of Object.keys(P.ms)) out[k] = `${P.n[k]}x ${(P.ms[k] / 1000).toFixed(1)}s`;
    Object.assign(out, {shader_modules: Sum(P.sources), distinct_sources: P.sources.size,
                        pipelines: Sum(P.pipelines), distinct_pipelines: P.pipelines.size});
    return out;
  };
})();
