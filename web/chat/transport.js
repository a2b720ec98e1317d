// The chat page's two back ends behind one interface, so the page is one front end for both:
//   ServerTransport: the kvq serve that served this page (/v1/chat/completions streamed as SSE,
//                    /props and /slots for the model's name and its KV cache);
//   TabTransport:    the in-tab runtime (../worker.js running the WebAssembly module), where the
//                    module renders the model's chat template and the worker's generate runs it.
// Both have: Describe() → {model, runtime, kv_format, kv_bytes, kv_note}; Chat(messages, params,
// on_text) → {text, stopped, finish, prompt_tokens, reused_tokens, completion_tokens,
// tokens_per_second}; Stop(); and RenderPrompt(messages) (the prompt text the model is given).
// params: {temperature, top_p, max_tokens, seed (null: random; else a 64-bit seed as its decimal
// digits), stop (optional: strings the reply ends before)}.

// An HTTP error's message: OpenAI's {"error": {"message"}} when the body has it.
async function HttpError(response, what) {
  const body = await response.text();
  let message = body.slice(0, 300);
  try {
    message = JSON.parse(body).error?.message ?? message;
  } catch (e) {
    // not JSON: the text as it came
  }
  return new Error(`${what}: HTTP ${response.status}: ${message}`);
}

export class ServerTransport {
  // api_key: '' or the server's --api-key (sent as a Bearer token).
  constructor(api_key) {
    this.kind = 'server';
    this.api_key = api_key;
    this.controller = null;  // the running reply's AbortController
  }

  Headers(json) {
    const h = json ? {'Content-Type': 'application/json'} : {};
    if (this.api_key) h.Authorization = `Bearer ${this.api_key}`;
    return h;
  }

  // The API is the serving origin's: kvq serve's routes are at its root (the page at /chat/).
  async Get(path) {
    const response = await fetch(new URL(`/${path}`, location.origin), {headers: this.Headers(false)});
    if (!response.ok) throw await HttpError(response, `GET /${path}`);
    return response.json();
  }

  // body: an object, or JSON text as it is to be sent.
  async Post(path, body, signal) {
    const text = typeof body === 'string' ? body : JSON.stringify(body);
    const response = await fetch(new URL(`/${path}`, location.origin),
                                 {method: 'POST', headers: this.Headers(true), body: text, signal});
    if (!response.ok) throw await HttpError(response, `POST /${path}`);
    return response;
  }

  // The served model and its cache: the format from /props, the bytes its sessions hold now from
  // /slots (summed: every session's cache is memory the server holds).
  async Describe() {
    const [props, slots] = await Promise.all([this.Get('props'), this.Get('slots')]);
    const kv_bytes = slots.reduce((sum, s) => sum + s.kv_bytes, 0);
    const positions = slots.reduce((sum, s) => sum + s.positions, 0);
    return {
      model: props.model,
      runtime: `kvq serve (${props.architecture}, ${props.layers} layers, context ${props.context})`,
      kv_format: `K ${props.kv.key}, V ${props.kv.value}`,
      kv_bytes,
      kv_note: `${positions} positions in ${slots.length} session${slots.length === 1 ? '' : 's'}; ` +
               `${props.kv.bytes_at_full_context.toLocaleString('en-US')} bytes per session at full context`,
    };
  }

  async RenderPrompt(messages) {
    const response = await this.Post('apply-template', {messages});
    return (await response.json()).prompt;
  }

  // Streams the reply; on_text(delta) for each piece. Stop() aborts the request, which ends the
  // server's job (it finds the closed connection at its next write).
  async Chat(messages, params, on_text) {
    const controller = new AbortController();
    this.controller = controller;
    // reasoning_format none: a thought stays in the reply's text, as the in-tab runtime shows it
    // (the server's default would move it to delta.reasoning_content, which this page does not show).
    const body = {messages, stream: true, temperature: params.temperature, top_p: params.top_p,
                  max_tokens: params.max_tokens, reasoning_format: 'none'};
    if (params.stop?.length) body.stop = params.stop;
    let text = JSON.stringify(body);
    if (params.seed !== null) {
      // As an integer literal (JSON.stringify's Number would round a seed past 2^53). The server
      // reads a 64-bit signed seed and takes its bits as the unsigned seed, so a seed from 2^63 on
      // is sent as seed - 2^64: the same 64 bits (2^64 - 1 goes as -1, which the server, like
      // kvq run --seed, takes as "random").
      const seed = BigInt(params.seed);
      text = `${text.slice(0, -1)},"seed":${seed < 1n << 63n ? seed : seed - (1n << 64n)}}`;
    }
    const result = {text: '', stopped: false, finish: null, prompt_tokens: null, reused_tokens: null,
                    completion_tokens: null, tokens_per_second: null};
    try {
      const response = await this.Post('v1/chat/completions', text, controller.signal);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += value;
        // Server-Sent Events: events end with a blank line; comments (": waiting") carry nothing.
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const event = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          for (const line of event.split('\n')) {
            if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
            const chunk = JSON.parse(line.slice(6));
            if (chunk.error) throw new Error(`the server: ${chunk.error.message}`);
            const choice = chunk.choices?.[0];
            const delta = choice?.delta?.content;
            if (delta) {
              result.text += delta;
              on_text(delta);
            }
            if (choice?.finish_reason) result.finish = choice.finish_reason;
            if (chunk.usage) {
              result.prompt_tokens = chunk.usage.prompt_tokens;
              result.completion_tokens = chunk.usage.completion_tokens;
              result.reused_tokens = chunk.usage.prompt_tokens_details?.cached_tokens ?? 0;
            }
            if (chunk.timings) result.tokens_per_second = chunk.timings.predicted_per_second;
          }
        }
      }
    } catch (e) {
      if (e.name !== 'AbortError') throw e;
      result.stopped = true;
    } finally {
      this.controller = null;
    }
    return result;
  }

  Stop() {
    this.controller?.abort();
  }
}

// The in-tab runtime: ../worker.js, one request at a time per id (its protocol: {type, id, ...}).
export class TabTransport {
  constructor() {
    this.kind = 'tab';
    this.worker = new Worker('../worker.js');
    this.pending = new Map();  // id → {resolve, reject, on_progress}
    this.next_id = 1;
    this.model = null;         // {name, info} of the loaded model
    this.kv = {key: 'f16', value: 'f16'};
    this.last_stats = null;    // the last reply's session stats
    this.last_path = null;     // and the path that ran it ({device: 'gpu', adapter} or {device: 'cpu', why})
    this.turns = [];           // per reply: {prompt_ids, reply_ids, reused, prefilled, positions (held after it),
                               // finish} as kvq chat --json reports them (a test compares them), and
                               // device: the path that ran it ('gpu' or 'cpu')
    this.worker.onmessage = (event) => {
      const m = event.data;
      const request = this.pending.get(m.id);
      if (!request) return;
      if (m.type === 'progress') return request.on_progress?.(m);
      this.pending.delete(m.id);
      if (m.type === 'error') request.reject(new Error(m.message));
      else request.resolve(m.type === 'done' ? m : m.result);
    };
    this.worker.onerror = (e) => {
      e.preventDefault();
      const error = new Error(`worker: ${e.message || 'failed to start (is the page served over HTTP?)'}`);
      for (const request of this.pending.values()) request.reject(error);
      this.pending.clear();
    };
  }

  Ask(type, fields = {}, transfer = [], on_progress = null) {
    const id = this.next_id++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, {resolve, reject, on_progress});
      this.worker.postMessage({type, id, ...fields}, transfer);
    });
  }

  // gpu: false turns the WebGPU path off (?gpu=0); gpu_forced takes it even on an emulated
  // adapter (?gpu=1), as the runtime page's settings do.
  async Start(want_simd, {gpu = true, gpu_forced = false} = {}) {
    this.build = await this.Ask('init', {simd: want_simd, gpu, gpu_forced});
    return this.build;
  }

  // files: null (the bundled stories260K) or picker.js's CheckModelFiles result ({model: {name,
  // kind, file: File}, tokenizer}); the worker reads the File into the module in chunks.
  async Load(files) {
    this.model = files ? await this.Ask('load', {files}, []) : await this.Ask('load_bundled');
    this.last_stats = null;
    this.last_path = null;
    return this.model;
  }

  SetKv(key, value) {
    this.kv = {key, value};
  }

  async Describe() {
    if (!this.model) throw new Error('no model is loaded in this tab yet');
    const i = this.model.info;
    const s = this.last_stats;
    return {
      model: this.model.name,
      runtime: `this tab (${this.last_path?.device === 'gpu' ? `WebGPU on ${this.last_path.adapter}` :
                            `WebAssembly ${this.build?.build ?? ''}`}; ${i.architecture}, ${i.n_layers} layers, ` +
               `context ${i.context})`,
      kv_format: `K ${s?.kv_key_format ?? this.kv.key}, V ${s?.kv_value_format ?? this.kv.value}`,
      kv_bytes: s ? s.kv_bytes : 0,
      kv_note: s ? `${s.positions} positions, ${s.kv_bytes_per_token} bytes per token` : 'no reply yet',
    };
  }

  // template_override: Jinja source to render with instead of the model's ('' : the model's).
  async RenderPrompt(messages, template_override = '') {
    return (await this.Ask('apply_template', {messages, add_generation_prompt: true, template_override})).prompt;
  }

  // The whole conversation is rendered each turn, as the server renders it; the worker keeps the
  // cache between turns (generate's chat mode) on either path (the WebGPU path where it runs the
  // model greedily, else WebAssembly), so the history's tokens come from its cache and only the new
  // ones are prefilled.
  async Chat(messages, params, on_text) {
    const prompt = await this.RenderPrompt(messages);
    // The seed's digits go to the module whole (module_sampler.js's SeedWords takes them).
    const seed = params.seed ?? (crypto.getRandomValues(new Uint32Array(1))[0] & 0x7fffffff);
    // The worker's posts carry the reply so far (completion: text its rules have released);
    // those of the prompt's blocks carry none.
    let shown = 0;
    const reply = (m) => {
      if (m.completion === undefined) return '';
      if (m.completion.length > shown) on_text(m.completion.slice(shown));
      shown = m.completion.length;
      return m.completion;
    };
    const done = await this.Ask('generate', {params: {
      prompt, kv_k: this.kv.key, kv_v: this.kv.value, temperature: params.temperature, top_k: 0,
      top_p: params.top_p, min_p: 0, seed, max_tokens: params.max_tokens, stop: params.stop ?? [], device: 'auto',
      chat: true}},
      [], reply);
    const text = reply(done);
    this.last_stats = done.stats.session;
    this.last_path = done.path;
    const t = done.timing;
    // The reply's ids as kvq chat reports them: without the end token it stopped on.
    this.turns.push({prompt_ids: done.ids.slice(0, t.n_prompt), reply_ids: done.ids.slice(t.n_prompt,
                       done.end_token ? -1 : undefined), reused: t.n_reused, prefilled: t.n_prompt_held - t.n_reused,
                     positions: done.stats.session.positions, finish: done.finish_reason, device: done.path.device});
    return {text, stopped: done.stopped, finish: done.stopped ? null : done.finish_reason,
            prompt_tokens: t.n_prompt, reused_tokens: t.n_reused, completion_tokens: t.n_generated,
            tokens_per_second: t.decode_ms > 0 && t.n_generated > 0 ? t.n_generated / (t.decode_ms / 1000) : null};
  }

  Stop() {
    this.worker.postMessage({type: 'stop'});
  }
}
