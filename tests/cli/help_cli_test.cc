// Every subcommand's --help, found from the CLI's own listing (never a hand list): it answers with
// exit 0 and a usage line, and no help text carries a project-internal label (an issue or seed
// number, a planning term) that a user could not look up, and an option that takes a path says so
// in its placeholder (FILE or DIR, not CLI11's TEXT).
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util/run_kvq.h"

namespace {

// The names listed under "Subcommands:" in one help text (each line: two spaces, the name, spaces,
// its description; description continuation lines are indented further).
std::vector<std::string> ListedSubcommands(const std::string& help) {
  std::vector<std::string> names;
  std::istringstream in(help);
  std::string line;
  bool listing = false;
  static const std::regex entry("^  ([a-z][a-z0-9-]*)(\\s|$).*");
  while (std::getline(in, line)) {
    if (line.rfind("Subcommands:", 0) == 0) {
      listing = true;
      continue;
    }
    std::smatch m;
    if (listing && std::regex_match(line, m, entry)) names.push_back(m[1]);
  }
  return names;
}

// Labels that mean something only inside the project's planning.
const std::regex& InternalLabel() {
  static const std::regex label("(\\b(issue|seed)\\s*#?\\s*[0-9]{1,3}\\b)|kill criterion|must show|\\bTODO\\b|FIXME",
                                std::regex::icase);
  return label;
}

// "  -m,--model TEXT   GGUF (.gguf) or ..." where the option's own line or description names a file
// or folder, or whose name ends in -file, -dir, -folder or -path: the options whose placeholder
// should say FILE or DIR. A description continued on the next lines is not read (the first line
// names what the value is).
std::vector<std::string> PathOptionsShownAsText(const std::string& help) {
  static const std::regex option("^\\s+(-[^ ]+) (TEXT[^ ]*)\\s+(.*)$");
  static const std::regex path_word("\\b(file|folder|directory|FILE|DIR)\\b|\\(\\.gguf\\)", std::regex::icase);
  static const std::regex path_name("-(file|dir|folder|path)(,|$)");  // --json-schema-file, --kv-disk-dir
  std::vector<std::string> found;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, option)) continue;
    if (std::regex_search(m[3].str(), path_word) || std::regex_search(m[1].str(), path_name)) found.push_back(m[1]);
  }
  return found;
}

TEST(HelpCli, EverySubcommandAnswersHelpWithoutInternalLabels) {
  std::vector<std::string> pending = {""};  // command paths, "" = kvq itself
  std::set<std::string> seen;
  while (!pending.empty()) {
    const std::string path = pending.back();
    pending.pop_back();
    if (!seen.insert(path).second) continue;
    const kvq_test::KvqRun r = kvq_test::RunKvq(path + " --help");
    const std::string shown = path.empty() ? "kvq --help" : "kvq " + path + " --help";
    ASSERT_EQ(r.exit_code, 0) << shown << "\n" << r.err;
    EXPECT_NE(r.out.find("Usage:"), std::string::npos) << shown << " printed no usage line:\n" << r.out;
    std::smatch m;
    EXPECT_FALSE(std::regex_search(r.out, m, InternalLabel()))
        << shown << " shows an internal label: \"" << m.str() << "\"";
    for (const std::string& name : PathOptionsShownAsText(r.out)) {
      ADD_FAILURE() << shown << ": " << name << " takes a path but shows the placeholder TEXT (type_name FILE or DIR)";
    }
    for (const std::string& name : ListedSubcommands(r.out)) pending.push_back(path.empty() ? name : path + " " + name);
  }
  // The walk reached nested commands (bench and eval have their own), so the listing parse works.
  EXPECT_TRUE(seen.count("bench decode")) << "the walk did not reach `kvq bench decode`";
  EXPECT_TRUE(seen.count("eval fidelity")) << "the walk did not reach `kvq eval fidelity`";
  EXPECT_GE(seen.size(), 20u);
}

TEST(HelpCli, ThePathPlaceholderRuleCatchesWhatItShould) {
  const std::vector<std::string> found = PathOptionsShownAsText(
      "  -m,--model TEXT             GGUF (.gguf) or llama2.c checkpoint (.bin)\n"
      "  --kv-disk TEXT              Keep the KV master copy in a file in DIR\n"
      "  -m,--model FILE             GGUF (.gguf) or llama2.c checkpoint (.bin)\n"
      "  --grammar TEXT              GBNF (llama.cpp's syntax) the output follows\n");
  EXPECT_EQ(found, (std::vector<std::string>{"-m,--model", "--kv-disk"}));
}

TEST(HelpCli, TheLabelPatternCatchesWhatItShould) {
  // The pattern itself must be able to fail the walk above.
  for (const char* bad : {"as issue 31 says", "seed 002's rule", "the Kill criterion", "Issue #7"}) {
    EXPECT_TRUE(std::regex_search(std::string(bad), InternalLabel())) << bad;
  }
  for (const char* fine : {"--seed UINT=1", "Seed: the same seed writes the same bytes", "issues a request"}) {
    EXPECT_FALSE(std::regex_search(std::string(fine), InternalLabel())) << fine;
  }
}

}  // namespace
