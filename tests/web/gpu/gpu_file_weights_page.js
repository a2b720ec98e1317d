// In the page: a model loaded from its GGUF header alone (kvq_web_model_load_header: the page's GPU
// path when a GGUF file is picked) runs on the GPU with its weights read from the file, never from
// the module's memory. stories260K.gguf (F32, so the loaded whole file's matrices are the file's
// bytes, not repacked):
//   - the step program's tensors are given by file_offset (address 0), and the file's bytes there
//     equal, byte for byte, the whole-file model's tensors at their addresses;
//   - 120 greedy int8 ids after a prompt equal the whole-file model's GPU run's, exactly (the same
//     kernels over the same bytes), with the device destroyed after 40 ids: the runner re-reads
//     the weights from the file for the new device (the bytes read are counted);
//   - no device coming back: the rest runs on the whole file's model (options.cpu_model, as the
//     worker loads it on demand), with the ids of the same loss on the whole-file model's runner;
//   - the module refuses the CPU forward of the header-only model (a session, a CPU step).
import {GpuModelRunner, GpuProgramOf, RequestGpuDevice} from '/web/gpu/gpu_engine.js';
import {LoadModule} from '/test/gpu_kv_device_page.js';
import {FirstDifference, Generate, LoadModel, Tokenize} from '/test/gpu_device_loss_page.js';

const kUrl = '/models/stories260K.gguf';
const kPrompt = 'Once upon a time';
const kSpec = 'int8';
const kLoseAt = 40;

// The header-only model of the GGUF file `bytes` (its first 1 KiB, then twice as much until the
// module can tell the header's length, as the worker reads a picked file); returns its handle.
function LoadHeader(M, bytes, name) {
  if (!M.FS.analyzePath('/models').exists) M.FS.mkdir('/models');  // where the module maps it (as the worker's Init)
  for (let n = Math.min(bytes.length, 1024); ; n = Math.min(bytes.length, 2 * n)) {
    const ptr = M._kvq_web_file_alloc(n);
    M.HEAPU8.set(bytes.subarray(0, n), ptr);
    const header = M.ccall('kvq_web_gguf_header_bytes', 'number', ['number', 'number', 'number', 'string'],
                           [ptr, n, bytes.length, name]);
    if (header > 0) {
      const model = M.ccall('kvq_web_model_load_header', 'number',
                            ['number', 'number', 'number', 'string', 'string', 'number'], [ptr, n, bytes.length, name, '', 1]);
      if (!model) throw new Error(`loading ${name} from its header: ${M.UTF8ToString(M._kvq_web_last_error())}`);
      return model;
    }
    M._kvq_web_file_free(ptr);
    if (header < 0 || n === bytes.length) throw new Error(`${name}: no header (${M.UTF8ToString(M._kvq_web_last_error())})`);
  }
}

export async function RunGpuFileWeightsTests(bundle_url) {
  const t0 = performance.now();
  const failures = [];
  const fail = (m) => failures.push(m);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], runs: 0};
  const M = await LoadModule(bundle_url);
  const response = await fetch(kUrl);
  const file = new Uint8Array(await response.arrayBuffer());
  const whole = await LoadModel(M, kUrl, '');
  const head = LoadHeader(M, file, 'stories260K.gguf');
  const made_whole = GpuProgramOf(M, whole), made_head = GpuProgramOf(M, head);
  if (!made_whole.program || !made_head.program) {
    return {failures: [`no step program: ${made_whole.why_not || made_head.why_not}`], runs: 0};
  }
  const program = made_head.program;
  // The file's bytes at each tensor's offset are the whole-file model's at its address.
  let tensors = 0;
  program.tensors.forEach((t, i) => {
    const w = made_whole.program.tensors[i];
    if (t.file_offset === undefined || t.address !== 0) fail(`${t.name}: address ${t.address}, file offset ${t.file_offset}`);
    const a = file.subarray(t.file_offset, t.file_offset + t.bytes), b = M.HEAPU8.subarray(w.address, w.address + w.bytes);
    if (t.bytes !== w.bytes || a.some((v, j) => v !== b[j])) fail(`${t.name}: the file's bytes differ from the loaded model's`);
    ++tensors;
  });
  let read_bytes = 0;
  const read_file = async (offset, n) => {
    read_bytes += n;
    return file.slice(offset, offset + n);
  };
  const prompt = Tokenize(M, head, kPrompt);
  const lose = (runner) => (i) => {
    if (i === kLoseAt && runner.device) runner.device.destroy();
  };
  let runs = 0;
  const Check = (what, got, want) => {
    ++runs;
    const at = FirstDifference(got.ids, want.ids);
    if (at >= 0) fail(`${what}: id ${at} is ${got.ids[at]}, expected ${want.ids[at]}`);
  };
  // The whole file's GPU run: the reference.
  const reference = await GpuModelRunner.Create(M, await RequestGpuDevice(program), whole, made_whole.program);
  const want = await Generate(reference, kSpec, prompt);
  reference.Destroy();
  // The header-only model, its device lost after kLoseAt ids and a new one given.
  const survivor = await GpuModelRunner.Create(M, await RequestGpuDevice(program), head, program, {read_file});
  const first_upload = read_bytes;
  if (first_upload !== survivor.weight_bytes) fail(`${first_upload} bytes read from the file for ${survivor.weight_bytes} of weights`);
  Check('header-only model, device lost and re-acquired', await Generate(survivor, kSpec, prompt, lose(survivor)), want);
  if (read_bytes !== 2 * first_upload) fail(`${read_bytes} bytes read in all: the new device did not get the file's weights`);
  if (survivor.events.length !== 1 || survivor.events[0].to !== 'gpu') fail(`events ${JSON.stringify(survivor.events)}`);
  survivor.Destroy();
  // No device comes back: the rest on the CPU, the whole file's model, as on the whole file's runner.
  const none = async () => null;
  const stranded_whole = await GpuModelRunner.Create(M, await RequestGpuDevice(program), whole, made_whole.program, {acquire: none});
  const want_cpu = await Generate(stranded_whole, kSpec, prompt, lose(stranded_whole));
  stranded_whole.Destroy();
  let asked = 0;
  const stranded = await GpuModelRunner.Create(M, await RequestGpuDevice(program), head, program,
                                               {read_file, acquire: none, cpu_model: async () => (++asked, whole)});
  Check('header-only model, device lost and none back (the whole file on the CPU)',
        await Generate(stranded, kSpec, prompt, lose(stranded)), want_cpu);
  if (asked !== 1 || stranded.cpu_steps === 0) fail(`the CPU model asked for ${asked} times, ${stranded.cpu_steps} CPU steps`);
  stranded.Destroy();
  // The module refuses the header-only model's CPU forward.
  const session = M.ccall('kvq_web_session_new', 'number', ['number', 'string', 'string', 'number'], [head, kSpec, kSpec, 0]);
  const why = M.UTF8ToString(M._kvq_web_last_error());
  if (session || !why.includes('header alone')) fail(`a CPU session of the header-only model: handle ${session}, "${why}"`);
  M._kvq_web_model_free(head);
  M._kvq_web_model_free(whole);
  return {runs, tensors, read_bytes, refusal: why, failures, seconds: (performance.now() - t0) / 1000};
}
