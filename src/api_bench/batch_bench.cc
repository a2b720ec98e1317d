// RunBatchBench (see batch_bench.h).
#include "api_bench/batch_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "kvq/session.h"

namespace kvq {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One arm: its sessions and the items of its decode step (every session, the same token).
struct Arm {
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<BatchItem> items;
  std::vector<double> seconds;  // [rounds] the timed steps of each round
};

// Fills every session of every arm with `context` positions: one prefill of a fixed prompt, then
// its snapshot loaded into the others (the same cache bytes, without recomputing them).
Status Fill(std::vector<Arm>& arms, int64_t context, int32_t vocab,
            const std::function<void(const std::string&)>& say) {
  if (context == 0) return Status::Ok();
  std::vector<int32_t> prompt(context);
  for (int64_t i = 0; i < context; ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % vocab);
  Session& first = *arms[0].sessions[0];
  const auto t0 = std::chrono::steady_clock::now();
  if (Status s = first.Prefill(prompt); !s.ok()) return s;
  say(fmt::format("context {}: prefilled one session in {:.1f} s", context,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("kvq_bench_batch_{}.snap", ::getpid()))
          .string();
  if (Status s = first.SavePrefix(path); !s.ok()) return s;
  Status status = Status::Ok();
  for (Arm& arm : arms) {
    for (std::unique_ptr<Session>& s : arm.sessions) {
      if (s.get() == &first || !status.ok()) continue;
      if (Result<int64_t> loaded = s->LoadPrefix(path); !loaded.ok()) status = loaded.status();
    }
  }
  std::filesystem::remove(path);
  return status;
}

// One step of every session of the arm, `steps` times: one RunBatch of all its items per step,
// or (concurrent) each session on its own OS thread running its own steps, all at once.
Status StepArm(Arm& arm, int32_t steps, bool concurrent) {
  if (!concurrent) {
    for (int32_t step = 0; step < steps; ++step) {
      if (Status s = Session::RunBatch(arm.items); !s.ok()) return s;
    }
    return Status::Ok();
  }
  std::vector<Status> status(arm.items.size(), Status::Ok());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < arm.items.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int32_t step = 0; step < steps && status[i].ok(); ++step)
        status[i] = Session::RunBatch(std::span<const BatchItem>(&arm.items[i], 1));
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

int64_t BatchBenchPositions(const BatchBenchConfig& config, int64_t context) {
  return context + 1 + int64_t{config.rounds} * config.steps;
}

Result<std::vector<BatchBenchRow>> RunBatchBench(
    const Model& model, const BatchBenchConfig& config,
    const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  if (config.sessions.empty()) return Status::Error("no session counts to run");
  for (int32_t n : config.sessions) {
    if (n < 1) return Status::Error(fmt::format("a session count must be at least 1 (got {})", n));
  }
  if (config.steps < 1 || config.rounds < 1)
    return Status::Error("steps and rounds must be at least 1");
  if (config.concurrent && (config.session_threads < 1 || config.session_threads > 1024)) {
    return Status::Error(
        fmt::format("session_threads must be in 1..1024 (got {})", config.session_threads));
  }
  const int32_t vocab = model.info().vocab_size;
  const int32_t token = 1 % vocab;  // any token will do: a step's cost does not depend on which one
  std::vector<BatchBenchRow> rows;
  for (int64_t context : config.contexts) {
    const int64_t positions = BatchBenchPositions(config, context);
    if (context < 0 || positions > model.info().context) {
      return Status::Error(
          fmt::format("context {} plus {} decode steps is past the model's context of {} "
                      "positions",
                      context, positions - context, model.info().context));
    }
    std::vector<Arm> arms(config.sessions.size());
    for (size_t a = 0; a < arms.size(); ++a) {
      for (int32_t i = 0; i < config.sessions[a]; ++i) {
        Result<std::unique_ptr<Session>> s = model.NewSession(config.kv);
        if (!s.ok()) return s.status();
        if (config.concurrent) {
          if (Status t = (*s)->SetThreads(config.session_threads); !t.ok()) return t;
        }
        arms[a].sessions.push_back(std::move(s).value());
      }
    }
    if (Status s = Fill(arms, context, vocab, say); !s.ok()) return s;
    for (Arm& arm : arms) {
      for (std::unique_ptr<Session>& s : arm.sessions) {
        arm.items.push_back({.session = s.get(), .tokens = std::span<const int32_t>(&token, 1)});
      }
      if (Status s = StepArm(arm, 1, config.concurrent); !s.ok())
        return s;  // warm-up: pools, scratch, pages
    }
    for (int32_t round = 0; round < config.rounds; ++round) {
      for (size_t j = 0; j < arms.size();
           ++j) {  // rotated: each arm takes every place in the order
        Arm& arm = arms[(j + round) % arms.size()];
        const auto t0 = std::chrono::steady_clock::now();
        if (Status s = StepArm(arm, config.steps, config.concurrent); !s.ok()) return s;
        arm.seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      say(fmt::format("context {}: round {} of {} done", context, round + 1, config.rounds));
    }
    const std::span<const float> reference = arms[0].sessions[0]->logits();
    double first_tps = 0;
    for (size_t a = 0; a < arms.size(); ++a) {
      Arm& arm = arms[a];
      const double n = static_cast<double>(arm.sessions.size());
      std::vector<double> tps;
      for (double s : arm.seconds) tps.push_back(n * config.steps / s);
      BatchBenchRow r{.context = context, .sessions = config.sessions[a]};
      r.tokens_per_second = Median(tps);
      r.tps_min = *std::min_element(tps.begin(), tps.end());
      r.tps_max = *std::max_element(tps.begin(), tps.end());
      r.ms_per_step = 1000 * Median(arm.seconds) / config.steps;
      r.per_session_tps = r.tokens_per_second / n;
      if (a == 0) first_tps = r.tokens_per_second;
      r.vs_first = r.tokens_per_second / first_tps;
      r.bit_identical = true;
      for (const std::unique_ptr<Session>& s : arm.sessions) {
        const std::span<const float> l = s->logits();
        r.bit_identical = r.bit_identical && l.size() == reference.size() &&
                          std::memcmp(l.data(), reference.data(), l.size_bytes()) == 0;
      }
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace kvq
