// The reference run.c's greedy runs of the bundled stories260K (models/stories260K/golden-runc-ids.txt):
// per prompt, the token ids including BOS and the prompt, a final 1 meaning run.c stopped on BOS.
#pragma once

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace kvq::test {

struct GoldenRun {
  std::string prompt;
  std::vector<int32_t> ids;  // [BOS, prompt..., generated...]
};

inline std::vector<GoldenRun> ReadGoldenRuns() {
  std::ifstream in(std::string(KVQ_SOURCE_DIR) + "/models/stories260K/golden-runc-ids.txt");
  std::vector<GoldenRun> out;
  std::string line;
  const std::regex header(R"re(=== model=stories260K\.bin prompt="(.*)" \(token ids)re");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, header)) {
      out.push_back({m[1].str(), {}});
    } else if (line.rfind("IDS:", 0) == 0 && !out.empty()) {
      std::istringstream ids(line.substr(4));
      for (int32_t id; ids >> id;) out.back().ids.push_back(id);
    }
  }
  return out;
}

}  // namespace kvq::test
