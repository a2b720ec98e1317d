// `kvq tokenize`: the tokens of a text under a GGUF vocabulary, as llama.cpp's llama-tokenize
// prints them ("id -> 'piece'" per token), or just the ids. Only the GGUF metadata is read (the
// weights are never touched), so -m may be a vocabulary-only GGUF such as llama.cpp's
// models/ggml-vocab-*.gguf. With no -m it uses the bundled stories260K.gguf. --vocab reads a
// Hugging Face tokenizer.json instead, normalizer included. Both through kvq::Vocabulary
// (kvq/vocabulary.h).
#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>

#include "cli/chat_conversation.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "kvq/vocabulary.h"

namespace kvq::cli {
namespace {

struct TokenizeOptions {
  SharedOptions shared;  // -m (a GGUF; empty: the bundled stories260K.gguf)
  std::string prompt;
  bool prompt_given = false;
  std::string file;
  std::string vocab;  // a tokenizer.json, instead of -m
  bool ids = false;
  bool no_bos = false;
};

/// `bytes` for a terminal: valid UTF-8 as it is; \n, \t, \r, \\ and other control characters
/// (C0, DEL, C1) escaped; a byte that is not part of a valid character as \xNN (byte-level BPE
/// tokens often hold part of a character).
std::string Printable(std::string_view bytes) {
  std::string out;
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = ValidUtf8Length(bytes, at);
    const auto b0 = static_cast<uint8_t>(bytes[at]);
    // C0 controls and DEL (one byte), C1 controls (U+0080..U+009F: C2 80..C2 9F).
    const bool control = (n == 1 && (b0 < 0x20 || b0 == 0x7F)) ||
                         (n == 2 && b0 == 0xC2 && static_cast<uint8_t>(bytes[at + 1]) < 0xA0);
    if (bytes[at] == '\n') {
      out += "\\n";
    } else if (bytes[at] == '\t') {
      out += "\\t";
    } else if (bytes[at] == '\r') {
      out += "\\r";
    } else if (bytes[at] == '\\') {
      out += "\\\\";
    } else if (n == 0 || control) {
      for (size_t i = 0; i < std::max<size_t>(n, 1); ++i) {
        out += fmt::format("\\x{:02x}", static_cast<uint8_t>(bytes[at + i]));
      }
    } else {
      out.append(bytes.substr(at, n));
    }
    at += std::max<size_t>(n, 1);
  }
  return out;
}

int RunTokenize(const TokenizeOptions& o) {
  const auto bad = [](const std::string& m) { return BadInput("tokenize", m); };
  if (o.prompt_given && !o.file.empty()) return bad("-p and -f both give the text; use one of them");
  if (!o.prompt_given && o.file.empty()) return bad("no text: give it with -p TEXT or -f FILE");
  std::string text = o.prompt;
  if (!o.file.empty()) {
    std::ifstream in(o.file, std::ios::binary);
    if (!in) return bad(fmt::format("-f {}: cannot read the file: {}", o.file, std::strerror(errno)));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) return bad(fmt::format("-f {}: read error", o.file));
  }

  if (!o.vocab.empty() && !o.shared.model.empty()) return bad("-m and --vocab both give the vocabulary; use one");
  const std::string path = !o.vocab.empty()          ? o.vocab
                           : o.shared.model.empty() ? BundledModelFile("stories260K.gguf")
                                                    : o.shared.model;
  const std::string flag = o.vocab.empty() ? "-m" : "--vocab";
  Result<std::unique_ptr<Vocabulary>> vocabulary =
      o.vocab.empty() ? Vocabulary::OpenGguf(path) : Vocabulary::OpenHfTokenizerJson(path);
  if (!vocabulary.ok()) return bad(fmt::format("{} {}: {}", flag, path, vocabulary.status().message()));
  const Vocabulary& v = **vocabulary;

  const bool bos = !o.ids && !o.no_bos && v.adds_bos();
  const std::vector<int32_t> ids = v.Tokenize(text, bos ? AddBos::kYes : AddBos::kNo);
  if (o.ids) {
    std::string line;
    for (const int32_t id : ids) {
      if (!line.empty()) line += ' ';
      line += std::to_string(id);
    }
    fmt::print("{}\n", line);
  } else {
    for (const int32_t id : ids) {
      // A byte piece shows its byte; every other token its piece (control tokens as their text).
      const std::string shown = v.IsByteToken(id) ? *v.Detokenize(std::span(&id, 1)) : v.TokenPiece(id);
      fmt::print("{:>6} -> '{}'\n", id, Printable(shown));
    }
  }
  fmt::print(stderr, "kvq tokenize: {} token{} from {} bytes ({}, {})\n", ids.size(), ids.size() == 1 ? "" : "s",
             text.size(), path, v.Description());
  return 0;
}

}  // namespace

void AddTokenizeCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Print the tokens of a text under a GGUF vocabulary (like llama.cpp's llama-tokenize)");
  AddModelFlag(cmd, &o->shared,
               "GGUF model or vocabulary-only GGUF (only its tokenizer metadata is read); "
               "default: models/stories260K/stories260K.gguf");
  cmd->add_option("-p,--prompt", o->prompt, "The text to tokenize")->each([o](const std::string&) {
    o->prompt_given = true;
  });
  cmd->add_option("--vocab", o->vocab,
                  "A Hugging Face tokenizer.json (byte-level BPE; tokenizer_config.json beside it is read "
                  "too) instead of -m")
      ->type_name("FILE");
  cmd->add_option("-f,--file", o->file, "Read the text from FILE (as it is, bytes included)")
      ->type_name("FILE");
  cmd->add_flag("--ids", o->ids,
                "Print only the ids, space-separated on one line, without BOS (the form of llama.cpp's "
                "ggml-vocab-*.gguf.out test files)");
  cmd->add_flag("--no-bos", o->no_bos, "Do not put BOS in front even if the vocabulary asks for it");
  cmd->callback([o, exit_code] { *exit_code = RunTokenize(*o); });
}

}  // namespace kvq::cli
