// Runs the kvq program from the CLI tests: `kvq <args>` through the shell, with its exit code,
// stdout and stderr. KVQ_BINARY is the program's path (a compile definition of every test).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kvq_test {

struct KvqRun {
  int exit_code;
  std::string out;
  std::string err;
};

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// `args` are pasted into a shell command line (quote what needs quoting). The output goes through
/// per-process temporary files: CTest runs test programs in parallel processes. Without a "<" in
/// `args`, stdin is /dev/null: `kvq run` without -p and `kvq chat` read a piped stdin, which would
/// wait on a test runner's open pipe.
inline KvqRun RunKvq(const std::string& args) {
  const std::string stem = testing::TempDir() + "/kvq_run_" + std::to_string(getpid());
  const std::string out = stem + ".out", err = stem + ".err";
  const std::string in = args.find('<') == std::string::npos ? " </dev/null" : "";
  const std::string cmd = std::string(KVQ_BINARY) + " " + args + in + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  KvqRun run{WIFEXITED(status) ? WEXITSTATUS(status) : -1, Slurp(out), Slurp(err)};
  std::remove(out.c_str());
  std::remove(err.c_str());
  return run;
}

/// Removes, when it is destroyed, the files a test program wrote as stem + "_" + NAME (stem: a
/// path whose file name holds the process id, so programs running in parallel keep theirs). A
/// static one does it at the program's exit: runs leave nothing in the temporary folder.
struct TempFilesRemovedAtExit {
  std::string stem;
  ~TempFilesRemovedAtExit() {
    namespace fs = std::filesystem;
    const fs::path p(stem);
    const std::string prefix = p.filename().string() + "_";
    std::error_code ec;  // (never a throw: this runs in a destructor)
    std::vector<fs::path> mine;
    for (fs::directory_iterator it(p.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().filename().string().rfind(prefix, 0) == 0) mine.push_back(it->path());
    }
    for (const fs::path& f : mine) fs::remove_all(f, ec);
  }
};

}  // namespace kvq_test
