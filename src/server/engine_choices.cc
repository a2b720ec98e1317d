// kvq serve's engine (see engine.h): the n choices of one request, its other choices started from
// forks of the first one's session once the prompt has run (Session::Fork shares the prompt's
// pages), so the prompt is prefilled once.
#include "server/engine.h"

namespace kvq::server {

std::variant<std::vector<std::shared_ptr<Job>>, ApiError> Engine::SubmitChoices(JobSpec spec, int32_t n) {
  std::vector<std::shared_ptr<Job>> jobs;
  for (int32_t i = 1; i < n; ++i) {
    JobSpec choice = spec;
    choice.sampling.seed = spec.sampling.seed + static_cast<uint64_t>(i);
    std::shared_ptr<Job> follower(new Job(std::move(choice)));
    follower->usage.prompt_tokens = static_cast<int64_t>(follower->spec.prompt.size());
    jobs.push_back(std::move(follower));
  }
  // The followers hang on the leader before it is queued: the scheduler may take it at once.
  std::vector<std::shared_ptr<Job>> followers = jobs;
  std::variant<std::shared_ptr<Job>, ApiError> leader = SubmitWith(std::move(spec), std::move(followers));
  if (auto* e = std::get_if<ApiError>(&leader)) return *e;
  jobs.insert(jobs.begin(), std::get<std::shared_ptr<Job>>(leader));
  for (size_t i = 1; i < jobs.size(); ++i) {
    jobs[i]->kv_reserved_bytes = jobs[0]->kv_reserved_bytes;
    jobs[i]->kv_reserved_draft_bytes = jobs[0]->kv_reserved_draft_bytes;
  }
  return jobs;
}

void Engine::QueueFront(std::vector<std::shared_ptr<Job>> jobs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = jobs.rbegin(); it != jobs.rend(); ++it) queue_.push_front(*it);
    metrics_->queued_requests = static_cast<int64_t>(queue_.size());
  }
  wake_.notify_all();
}

void Engine::StartFollowers(Slot& leader) {
  std::vector<std::shared_ptr<Job>> followers = std::move(leader.job->followers);
  leader.job->followers.clear();
  std::vector<std::shared_ptr<Job>> queued;
  for (std::shared_ptr<Job>& f : followers) {
    Slot* idle = nullptr;
    if (options_.kv_budget_bytes == 0) {
      for (Slot& s : slots_) {
        if (!s.job && &s != &leader) {
          idle = &s;
          break;
        }
      }
    }
    Result<std::unique_ptr<Session>> fork =
        idle != nullptr ? leader.session->Fork() : Result<std::unique_ptr<Session>>(Status::Error("no idle slot"));
    if (!fork.ok()) {
      queued.push_back(std::move(f));
      continue;
    }
    idle->session = std::move(fork).value();
    RecordBorrow(*idle, &leader, static_cast<size_t>(idle->session->positions()));
    idle->session->SetSampler(f->spec.sampling);
    FitDraftSession(*idle, *f);
    idle->from_disk = false;
    idle->pending.clear();
    idle->next_token = -1;
    idle->last_used = step_;
    {
      std::lock_guard<std::mutex> lock(f->mu);
      f->usage.cached_tokens = f->usage.prompt_tokens;  // shared with the leader, not prefilled
    }
    metrics_->prompt_tokens += f->usage.prompt_tokens;
    metrics_->prompt_tokens_reused += f->usage.prompt_tokens;
    idle->job = std::move(f);
    Advance(*idle);
  }
  if (!queued.empty()) QueueFront(std::move(queued));
}

}  // namespace kvq::server
