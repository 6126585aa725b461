// What carries a training result between processes: the result file (rank 0's worker hands
// it to the launcher) and the per-rank summary the control plane gathers.
#include "train/report.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "collie/error.h"
#include "core/strings.h"
#include "expect.h"
#include "train/comm_explained.h"
#include "train/memory_fit.h"

namespace collie::train {
namespace {

namespace fs = std::filesystem;

// A result whose every field holds a value of its own (none is its default), so that a field
// the file loses or swaps with another shows.
Result everyFieldSet() {
  Result r;
  r.run = "launch.nproc_per_node=2";
  r.name = "quick";
  r.model = "gpt";
  r.scheduler = "ring";
  r.compression = "powersgd";
  r.backend = "gloo";
  r.ranks = 2;
  r.parameters = 123456;
  r.flops_per_token = 7.5e5;
  r.steps = 40;
  r.timed_steps = 39;
  r.world_batch_samples = 16;
  r.world_batch_tokens = 4096;
  r.micro_batch = {3, 5};
  r.rebalances = {{10, {4, 4}}, {20, {3, 5}}};
  r.tokens_weighting = false;
  r.step_seconds = 0.25;
  r.tokens_per_second = 16384;
  r.comm_seconds = 0.031;
  r.exposed_seconds = 0.012;
  r.gather_seconds = 0.007;
  r.gather_exposed_seconds = 0.002;
  r.device = "cuda:0 (test)";
  r.comm_memory = "host-staged";
  r.schedulers_ran = "auto ran swing for 1,024 B";
  r.allreduce_bytes = 987654;
  r.sync_mode = "diloco";
  r.sync_every = 8;
  r.sync_warmup_steps = 3;
  r.sent_bytes_per_step = 24680.5;
  r.predicted_float32_comm_seconds = 0.25;
  r.sharding = "parameters";
  r.parameter_bytes = 111;
  r.gradient_bytes = 222;
  r.optimizer_bytes = 333;
  r.gathered_peak_bytes = 444;
  r.pooled_bytes = 555;
  r.peak_rss_bytes = {1e9, 2e9};
  r.units = 12;
  r.unit_parameters = 3152384;
  StepMemory m;
  m.resident = 9e8;
  m.resident_at_start = 7e8;
  m.process_ranks = 1;
  m.tracked = 4e8;
  m.tracked_at_start = 2e8;
  m.set_up = 2e8;
  m.forward = 1e8;
  m.backward = 5e7;
  m.gathered = 3e7;
  m.gradient_sync = 1e7;
  m.optimizer = 8e6;
  m.other = 2e6;
  m.forward_high = 1.2e8;
  m.file_backed_at_start = 1.5e8;
  m.set_up_peak = 8e8;
  m.limit = 2e9;
  m.limit_given = true;
  r.step_memory = {m, m};
  r.step_memory[1].process_ranks = 2;
  r.buckets = 6;
  r.predicted_comm_seconds = 0.029;
  r.link_alpha = 3e-5;
  r.link_beta = 8e-9;
  r.link_gap = 7e-6;
  r.link_bank = 128e3;
  r.between_nodes = true;
  r.compute_seconds = {0.2, 0.21};
  r.comm_explained.explained = true;
  r.comm_explained.link = 0.045;
  r.comm_explained.latency = 0.003;
  r.comm_explained.link_busy = 0.13;
  r.comm_explained.below_knee = 1;
  r.comm_explained.waiting = 0.008;
  r.comm_explained.busy_probed = true;
  r.comm_explained.beyond = 0.07;
  r.comm_explained.during_backward = 0.08;
  r.comm_explained.predicted_exposed = 0.04;
  r.comm_explained.exposed = 0.012;
  r.comm_explained.late = 0.006;
  r.straggler_score = {1.0, 0.8};
  r.straggler_wait_seconds = {0.01, 0.0};
  r.arrived_last = {0.1, 0.9};
  r.step_at_fastest_seconds = 0.22;
  r.straggler_steps = 30;
  r.first_loss = 10.5;
  r.last_loss = 4.25;
  r.sync.step = 40;
  r.sync.parameters = 12;
  r.sync.identical = false;
  r.sync.max_spread = 1e-6;
  r.sync.first_parameter = "wte.weight";
  r.sync.ranks = {1};
  r.sync.differing = 3;
  r.weight_sample = {0.5, -0.25};
  r.token_budgets = {1e9, 2e9};
  r.peak_flops = 1e14;
  r.compression_choice = "chose bf16: its synchronisation of a step is predicted shortest";
  r.predicted_codec_arithmetic_seconds = 0.004;
  r.interface_hosts = 2;
  r.interface_startup_sent_bytes = 5.8e7;
  r.interface_sent_bytes_per_step = 5.3e6;
  r.target_loss = 4.5;
  r.steps_to_target = 31;
  r.seconds_to_target = 12.5;
  r.loss_curve = {10.5, 7.25, 4.25};
  r.loss_curve_seconds = {0.3, 0.6, 0.9};
  r.loss_curve_first_step = 29;
  return r;
}

class ResultFile : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove(path_); }
  const std::string path_ =
      (fs::temp_directory_path() / ("collie-result-" + std::to_string(::getpid()) + ".json"))
          .string();
};

TEST_F(ResultFile, KeepsEveryFieldOfAResult) {
  const Result in = everyFieldSet();
  saveResult(path_, in);
  const Result out = loadResult(path_);
  EXPECT_EQ(out.run, in.run);
  EXPECT_EQ(out.name, in.name);
  EXPECT_EQ(out.model, in.model);
  EXPECT_EQ(out.scheduler, in.scheduler);
  EXPECT_EQ(out.compression, in.compression);
  EXPECT_EQ(out.backend, in.backend);
  EXPECT_EQ(out.ranks, in.ranks);
  EXPECT_EQ(out.parameters, in.parameters);
  EXPECT_EQ(out.flops_per_token, in.flops_per_token);
  EXPECT_EQ(out.steps, in.steps);
  EXPECT_EQ(out.timed_steps, in.timed_steps);
  EXPECT_EQ(out.world_batch_samples, in.world_batch_samples);
  EXPECT_EQ(out.world_batch_tokens, in.world_batch_tokens);
  EXPECT_EQ(out.micro_batch, in.micro_batch);
  ASSERT_EQ(out.rebalances.size(), 2u);
  EXPECT_EQ(out.rebalances[1].after_step, 20);
  EXPECT_EQ(out.rebalances[1].micro_batch, (std::vector<int>{3, 5}));
  EXPECT_EQ(out.tokens_weighting, in.tokens_weighting);
  EXPECT_EQ(out.step_seconds, in.step_seconds);
  EXPECT_EQ(out.tokens_per_second, in.tokens_per_second);
  EXPECT_EQ(out.comm_seconds, in.comm_seconds);
  EXPECT_EQ(out.exposed_seconds, in.exposed_seconds);
  EXPECT_EQ(out.gather_seconds, in.gather_seconds);
  EXPECT_EQ(out.gather_exposed_seconds, in.gather_exposed_seconds);
  EXPECT_EQ(out.device, in.device);
  EXPECT_EQ(out.comm_memory, in.comm_memory);
  EXPECT_EQ(out.schedulers_ran, in.schedulers_ran);
  EXPECT_EQ(out.allreduce_bytes, in.allreduce_bytes);
  EXPECT_EQ(out.sync_mode, in.sync_mode);
  EXPECT_EQ(out.sync_every, in.sync_every);
  EXPECT_EQ(out.sync_warmup_steps, in.sync_warmup_steps);
  EXPECT_EQ(out.sent_bytes_per_step, in.sent_bytes_per_step);
  EXPECT_EQ(out.predicted_float32_comm_seconds, in.predicted_float32_comm_seconds);
  EXPECT_EQ(out.compression_choice, in.compression_choice);
  EXPECT_EQ(out.predicted_codec_arithmetic_seconds, in.predicted_codec_arithmetic_seconds);
  EXPECT_EQ(out.interface_hosts, in.interface_hosts);
  EXPECT_EQ(out.interface_startup_sent_bytes, in.interface_startup_sent_bytes);
  EXPECT_EQ(out.interface_sent_bytes_per_step, in.interface_sent_bytes_per_step);
  EXPECT_EQ(out.target_loss, in.target_loss);
  EXPECT_EQ(out.steps_to_target, in.steps_to_target);
  EXPECT_EQ(out.seconds_to_target, in.seconds_to_target);
  EXPECT_EQ(out.loss_curve, in.loss_curve);
  EXPECT_EQ(out.loss_curve_seconds, in.loss_curve_seconds);
  EXPECT_EQ(out.loss_curve_first_step, in.loss_curve_first_step);
  EXPECT_EQ(out.sharding, in.sharding);
  EXPECT_EQ(out.parameter_bytes, in.parameter_bytes);
  EXPECT_EQ(out.gradient_bytes, in.gradient_bytes);
  EXPECT_EQ(out.optimizer_bytes, in.optimizer_bytes);
  EXPECT_EQ(out.gathered_peak_bytes, in.gathered_peak_bytes);
  EXPECT_EQ(out.pooled_bytes, in.pooled_bytes);
  EXPECT_EQ(out.peak_rss_bytes, in.peak_rss_bytes);
  ASSERT_EQ(out.step_memory.size(), 2u);
  // Every field of the record, through its JSON (written and read by one table).
  const nlohmann::json written = in.step_memory[1], read = out.step_memory[1];
  EXPECT_EQ(read, written);
  EXPECT_EQ(out.step_memory[1].process_ranks, 2);
  EXPECT_EQ(out.step_memory[1].gradient_sync, 1e7);
  EXPECT_EQ(out.buckets, in.buckets);
  EXPECT_EQ(out.predicted_comm_seconds, in.predicted_comm_seconds);
  EXPECT_EQ(out.link_alpha, in.link_alpha);
  EXPECT_EQ(out.link_beta, in.link_beta);
  EXPECT_EQ(out.link_gap, in.link_gap);
  EXPECT_EQ(out.link_bank, in.link_bank);
  EXPECT_EQ(out.between_nodes, in.between_nodes);
  EXPECT_EQ(out.compute_seconds, in.compute_seconds);
  auto explained = [](const CommExplained& e) {
    return std::make_tuple(e.explained, e.link, e.latency, e.link_busy, e.below_knee, e.waiting,
                           e.busy_probed, e.beyond, e.during_backward, e.exposed, e.late,
                           e.predicted_exposed);
  };
  EXPECT_EQ(explained(out.comm_explained), explained(in.comm_explained));
  EXPECT_EQ(out.straggler_score, in.straggler_score);
  EXPECT_EQ(out.straggler_wait_seconds, in.straggler_wait_seconds);
  EXPECT_EQ(out.arrived_last, in.arrived_last);
  EXPECT_EQ(out.step_at_fastest_seconds, in.step_at_fastest_seconds);
  EXPECT_EQ(out.straggler_steps, in.straggler_steps);
  EXPECT_EQ(out.first_loss, in.first_loss);
  EXPECT_EQ(out.last_loss, in.last_loss);
  EXPECT_EQ(out.sync.step, in.sync.step);
  EXPECT_EQ(out.sync.parameters, in.sync.parameters);
  EXPECT_EQ(out.sync.identical, in.sync.identical);
  EXPECT_EQ(out.sync.max_spread, in.sync.max_spread);
  EXPECT_EQ(out.sync.first_parameter, in.sync.first_parameter);
  EXPECT_EQ(out.sync.ranks, in.sync.ranks);
  EXPECT_EQ(out.sync.differing, in.sync.differing);
  EXPECT_EQ(out.weight_sample, in.weight_sample);
  EXPECT_EQ(out.token_budgets, in.token_budgets);
  EXPECT_EQ(out.peak_flops, in.peak_flops);
}

// The names are what scripts, benchmarks and users read from summary.json: a renamed key
// must fail here, not only in them.
TEST_F(ResultFile, KeepsTheNamesThatSummaryJsonReadersUse) {
  saveResult(path_, everyFieldSet());
  std::ifstream file(path_);
  const nlohmann::json j = nlohmann::json::parse(file);
  std::set<std::string> keys;
  for (const auto& item : j.items()) keys.insert(item.key());
  const std::set<std::string> expected = {"run",
                                          "name",
                                          "model",
                                          "scheduler",
                                          "compression",
                                          "compression_choice",
                                          "backend",
                                          "ranks",
                                          "parameters",
                                          "flops_per_token",
                                          "steps",
                                          "timed_steps",
                                          "world_batch_samples",
                                          "world_batch_tokens",
                                          "micro_batch",
                                          "grad_weighting",
                                          "step_s",
                                          "tokens_per_s",
                                          "comm_s",
                                          "exposed_comm_s",
                                          "allgather_s",
                                          "exposed_allgather_s",
                                          "device",
                                          "comm_memory",
                                          "schedulers_ran",
                                          "allreduce_bytes",
                                          "sync_mode",
                                          "sync_every",
                                          "sync_warmup_steps",
                                          "sent_bytes_per_step",
                                          "buckets",
                                          "predicted_float32_comm_s",
                                          "predicted_codec_arithmetic_s",
                                          "interface_hosts",
                                          "interface_startup_sent_bytes",
                                          "interface_sent_bytes_per_step",
                                          "target_loss",
                                          "steps_to_target",
                                          "seconds_to_target",
                                          "loss_curve",
                                          "loss_curve_s",
                                          "loss_curve_first_step",
                                          "sharding",
                                          "overlap",
                                          "parameter_bytes",
                                          "gradient_bytes",
                                          "gathered_peak_bytes",
                                          "pooled_bytes",
                                          "optimizer_bytes",
                                          "peak_rss_bytes",
                                          "step_memory",
                                          "units",
                                          "unit_parameters",
                                          "predicted_comm_s",
                                          "link_alpha_s",
                                          "link_beta_s_per_byte",
                                          "link_gap_s",
                                          "link_bank_bytes",
                                          "link_between_nodes",
                                          "compute_s",
                                          "comm_explained",
                                          "comm_link_s",
                                          "comm_latency_s",
                                          "comm_link_busy_s",
                                          "comm_busy_probed",
                                          "buckets_below_knee",
                                          "comm_waiting_s",
                                          "comm_beyond_s",
                                          "comm_during_backward_s",
                                          "explained_exposed_comm_s",
                                          "comm_last_arrival_late_s",
                                          "predicted_exposed_comm_s",
                                          "straggler_score",
                                          "straggler_wait_s",
                                          "arrived_last",
                                          "step_at_fastest_s",
                                          "straggler_steps",
                                          "rebalances",
                                          "first_loss",
                                          "last_loss",
                                          "sync",
                                          "token_budgets",
                                          "peak_flops",
                                          "weight_sample"};
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(j.at("grad_weighting"), "uniform");
  EXPECT_EQ(j.at("rebalances").at(0).at("after_step"), 10);
  EXPECT_EQ(j.at("rebalances").at(0).at("micro_batch"), (std::vector<int>{4, 4}));
  std::set<std::string> sync;
  for (const auto& item : j.at("sync").items()) sync.insert(item.key());
  EXPECT_EQ(sync, (std::set<std::string>{"step", "parameters", "identical", "max_spread",
                                         "first_parameter", "ranks", "differing"}));
  std::set<std::string> memory;
  for (const auto& item : j.at("step_memory").at(0).items()) memory.insert(item.key());
  EXPECT_EQ(memory,
            (std::set<std::string>{"resident_bytes", "resident_at_start_bytes", "process_ranks",
                                   "tracked_bytes", "tracked_at_start_bytes", "set_up_bytes",
                                   "forward_bytes", "backward_bytes", "gathered_bytes",
                                   "gradient_sync_bytes", "optimizer_bytes", "other_bytes",
                                   "forward_high_bytes", "file_backed_at_start_bytes",
                                   "set_up_peak_bytes", "limit_bytes", "limit_given"}));
}

TEST_F(ResultFile, NoPredictionTravelsAsNull) {
  Result in = everyFieldSet();
  in.predicted_comm_seconds = std::nan("");
  saveResult(path_, in);
  std::ifstream file(path_);
  EXPECT_TRUE(nlohmann::json::parse(file).at("predicted_comm_s").is_null());
  EXPECT_TRUE(std::isnan(loadResult(path_).predicted_comm_seconds));
}

TEST_F(ResultFile, AFileThatLacksAFieldIsRefusedNamingIt) {
  saveResult(path_, everyFieldSet());
  nlohmann::json j;
  {
    std::ifstream file(path_);
    j = nlohmann::json::parse(file);
  }
  j.erase("exposed_comm_s");
  std::ofstream(path_) << j.dump();
  EXPECT_TRUE(testing::throwsWith<InternalError>([&] { loadResult(path_); }, {"exposed_comm_s"}))
      << "a result without exposed_comm_s was read";
}

// The summary's table: the field rows' columns in their order, each value in its style,
// with the derived columns after the field each follows (speed-up and efficiency after
// tokens/s, the rest at the end); a second run of the same model on one rank is the speed-up's
// reference.
TEST(Summary, PrintsTheFieldColumnsWithTheDerivedOnesInPlace) {
  Result two = everyFieldSet();
  two.sharding = "none";
  Result one = two;
  one.run = "launch.nproc_per_node=1";
  one.ranks = 1;
  one.micro_batch = {8};
  one.tokens_per_second = 8192;
  one.straggler_score.clear();
  std::ostringstream out;
  printSummary(out, {one, two});
  const std::string text = out.str();
  std::istringstream lines(text);
  std::string header, first, second;
  std::getline(lines, header);  // "# Training: ..."
  std::getline(lines, header);
  std::getline(lines, first);
  std::getline(lines, second);
  EXPECT_EQ(header,
            "# run                        ranks micro-batch  step (s)  world batch   tokens/s "
            "speed-up efficiency  comm (s)  exposed (s)   loss first->last   20 tok/param  "
            "straggler score per rank")
      << text;
  EXPECT_EQ(second,
            "  nproc_per_node=2               2       [3,5]     0.250        4,096     16,384     "
            "2.00     100.0%    0.0310       0.0120    10.500 -> 4.250        2.5 min  1.00 0.80")
      << text;
  EXPECT_EQ(first.find("  nproc_per_node=1               1         [8]     0.250"), 0u) << text;
}

// The largest model that fits (train/memory_fit.h): the summary names the rank that fits
// least and where its memory figure comes from; ranks that are threads (one resident set)
// and models without units print no line.
TEST(Summary, NamesTheLargestModelThatFitsTheRankThatFitsLeast) {
  Result r = everyFieldSet();
  r.parameters = 12 * r.unit_parameters + 1'000'000;  // the units and a root of 1 M
  r.step_memory[1].process_ranks = 1;
  r.step_memory[0].limit = 1e9;  // the first rank fits least: not the last one by chance
  r.step_memory[1].limit = 2e9;
  const MemoryFitShape shape{r.parameters, r.unit_parameters, r.units, true};
  const MemoryFit tight = fitMemory(r.step_memory[0], shape, 1e9);
  ASSERT_GT(tight.largest_units, 0);
  auto summaryOf = [](const Result& one) {
    std::ostringstream out;
    printSummary(out, {one});
    return out.str();
  };
  std::string text = summaryOf(r);
  EXPECT_TRUE(testing::contains(
      text, {fmt::format("largest model that fits: rank 0's memory, 1000.0 MB "
                         "(launch.memory_limit), holds {} units of 3,152,384 "
                         "parameters ({} parameters in all; this run: 12)",
                         tight.largest_units, detail::withCommas(tight.largest_parameters))}));
  r.step_memory[0].limit_given = false;
  text = summaryOf(r);
  EXPECT_TRUE(
      testing::contains(text, {"rank 0's memory, 1000.0 MB (its share of its host's memory"}));
  r.step_memory[1].process_ranks = 2;
  text = summaryOf(r);
  EXPECT_TRUE(testing::lacks(text, {"largest model"}));
  r.step_memory[1].process_ranks = 1;
  r.units = 0;
  text = summaryOf(r);
  EXPECT_TRUE(testing::lacks(text, {"largest model"}));
}

TEST(RankSummary, PacksAndUnpacksEveryValue) {
  RankSummary in;
  in.step = 1.5;
  in.compute = 1.25;
  in.comm = 0.5;
  in.exposed = 0.125;
  in.gather = 0.0625;
  in.gather_exposed = 0.03125;
  in.first_loss_sum = 42;
  in.last_loss_sum = 17;
  in.timed_steps = 99;
  in.steps_run = 100;
  in.interface_startup_sent = 5e7;
  in.interface_steps_sent = 3e8;
  const std::vector<double> packed = in.pack();
  EXPECT_EQ(packed.size(), 12u);
  const RankSummary out = RankSummary::unpack(packed);
  EXPECT_EQ(out.step, in.step);
  EXPECT_EQ(out.compute, in.compute);
  EXPECT_EQ(out.comm, in.comm);
  EXPECT_EQ(out.exposed, in.exposed);
  EXPECT_EQ(out.gather, in.gather);
  EXPECT_EQ(out.gather_exposed, in.gather_exposed);
  EXPECT_EQ(out.first_loss_sum, in.first_loss_sum);
  EXPECT_EQ(out.last_loss_sum, in.last_loss_sum);
  EXPECT_EQ(out.timed_steps, in.timed_steps);
  EXPECT_EQ(out.steps_run, in.steps_run);
  EXPECT_EQ(out.interface_startup_sent, in.interface_startup_sent);
  EXPECT_EQ(out.interface_steps_sent, in.interface_steps_sent);
  EXPECT_THROW(RankSummary::unpack({1, 2, 3}), InternalError);
}

// On the lab the first rank of each host brings its host's interface counts: the job's
// figures are the mean over those hosts, per step over every step this run took; ranks that
// read none (-1) count for nothing, and off the lab there is nothing to say.
TEST(RankSummary, CombinesTheHostsInterfaceCountsPerHostAndStep) {
  auto rank = [](double startup, double steps) {
    RankSummary s;
    s.steps_run = 10;
    s.timed_steps = 9;
    s.interface_startup_sent = startup;
    s.interface_steps_sent = steps;
    return s;
  };
  Result r;
  combineRanks({rank(4e6, 1e7), rank(-1, -1), rank(6e6, 3e7), rank(-1, -1)}, 8, &r);
  EXPECT_EQ(r.interface_hosts, 2);
  EXPECT_DOUBLE_EQ(r.interface_startup_sent_bytes, 5e6);
  EXPECT_DOUBLE_EQ(r.interface_sent_bytes_per_step, 2e6);  // (1e7 + 3e7) / 2 hosts / 10 steps
  Result off;
  combineRanks({rank(-1, -1), rank(-1, -1)}, 8, &off);
  EXPECT_EQ(off.interface_hosts, 0);
  EXPECT_EQ(off.interface_sent_bytes_per_step, 0);
}

// The lines under the table for what a run measured on the lab, the target loss it reached
// (or not), and why auto chose its codec.
TEST(Summary, SaysWhatTheInterfacesCountedAndWhenTheTargetWasReached) {
  Result r = everyFieldSet();
  std::ostringstream out;
  printSummary(out, {r});
  std::string text = out.str();
  EXPECT_TRUE(
      testing::contains(text, {"the lab hosts' interfaces counted 5.300 MB sent per host per step",
                               "58.00 MB per host before the first step",
                               "train.target_loss 4.5: reached after step 31, 12.5 s after step 29 "
                               "began (where this run resumed",
                               "train.compression auto chose bf16"}));
  r.steps_to_target = 0;
  r.interface_hosts = 0;
  r.compression_choice.clear();
  std::ostringstream again;
  printSummary(again, {r});
  text = again.str();
  EXPECT_TRUE(testing::contains(text, {"train.target_loss 4.5: not reached in 3 steps"}));
  EXPECT_TRUE(testing::lacks(text, {"interfaces counted", "auto chose"}));
}

// Two buckets on two ranks over two steps: the first took 0.10 s on one rank and 0.06 s on
// the one that arrived last, and the other way round in the next step; the second 0.05 s on
// both. Measured 0.08 + 0.05 = 0.13 s a step (mean over ranks): 0.05 s the link's, 0.02 s
// waiting (0.08 - 0.06 in each step, though each rank's mean is 0.08), 0.06 s beyond both.
// The first bucket is below the knee (latency 0.02 of its 0.03 s), the second not.
TEST(CommExplained, SplitsTheMeasuredTimeAndPredictsTheExposedPart) {
  std::vector<BucketTimes> buckets(2);
  // Per step the mean over the ranks and the least.
  buckets[0] = {{0.08, 0.08}, {0.06, 0.06}, 0.03, 0.04, 0.02, 3};
  buckets[1] = {{0.05, 0.05}, {0.05, 0.05}, 0.02, 0.02, 0.001, 1};
  const CommExplained e =
      explainComm(buckets, /*exposed=*/0.03, /*backward=*/0.1, /*late=*/0, true);
  ASSERT_TRUE(e.explained);
  EXPECT_NEAR(e.link, 0.05, 1e-12);
  EXPECT_NEAR(e.link_busy, 0.06, 1e-12);
  EXPECT_TRUE(e.busy_probed);
  EXPECT_NEAR(e.latency, 0.021, 1e-12);
  EXPECT_EQ(e.below_knee, 1);
  EXPECT_NEAR(e.waiting, 0.02, 1e-12);
  EXPECT_NEAR(e.beyond, 0.06, 1e-12);
  EXPECT_NEAR(e.during_backward, 0.10, 1e-12);
  EXPECT_NEAR(e.exposed, 0.03, 1e-12);
  // Backward readies the first bucket at 3/4 of its 0.1 s, the second at its end; one
  // thread runs them, at the busy pace while backward computes: the first from 0.075, 0.025
  // s of its 0.04 (5/8) by 0.1, the rest at the idle pace, 3/8 of 0.03: 0.11125; then the
  // second, 0.02 s: 0.13125.
  EXPECT_NEAR(e.predicted_exposed, 0.03125, 1e-12);
  // A longer backward (0.2 s) runs the first whole at the busy pace, 0.15 to 0.19, and the
  // second from 0.2 at the idle pace: 0.02 s exposed.
  EXPECT_NEAR(predictExposed(buckets, 0.2, 0, true), 0.02, 1e-12);
  // The last rank 0.03 s late readies them at 0.105 and 0.13, and computes until 0.13: the
  // first 5/8 done by then, 0.13 + 0.01125, then 0.02 more, 0.06125 s after the mean rank's
  // backward (more than the lateness alone).
  const CommExplained waited = explainComm(buckets, 0.03, 0.1, /*late=*/0.03, true);
  EXPECT_NEAR(waited.late, 0.03, 1e-12);
  EXPECT_NEAR(waited.predicted_exposed, 0.06125, 1e-12);
  // The wait moves with the lateness one for one: late by 0.1, 0.13125.
  EXPECT_NEAR(predictExposed(buckets, 0.1, 0.1, true), 0.13125, 1e-12);
  // Without overlap both wait for backward's end, then go at the idle pace: 0.03 + 0.02.
  EXPECT_NEAR(predictExposed(buckets, 0.1, 0, false), 0.05, 1e-12);
  // Without a busy probe the idle link's pace: 0.075 + 0.03 = 0.105, 0.105 + 0.02.
  for (auto& b : buckets) b.predicted_busy = 0;
  EXPECT_NEAR(predictExposed(buckets, 0.1, 0, true), 0.025, 1e-12);
  EXPECT_FALSE(explainComm(buckets, 0.03, 0.1, 0, true).busy_probed);
  // A bucket predicted to take no time is not below the knee.
  buckets[1].predicted = buckets[1].latency = 0;
  EXPECT_EQ(explainComm(buckets, 0.03, 0.1, 0, true).below_knee, 1);
  // Nothing to explain without buckets or without a rank's times.
  EXPECT_FALSE(explainComm({}, 0, 0.1, 0, true).explained);
  buckets[1].fastest.pop_back();
  EXPECT_FALSE(explainComm(buckets, 0, 0.1, 0, true).explained);
}

TEST(Summary, ExplainsTheAllReduceWhereItWasExplained) {
  Result r = everyFieldSet();
  r.sharding = "none";
  r.compression = "none";
  std::ostringstream out;
  printSummary(out, {r});
  std::string text = out.str();
  EXPECT_TRUE(testing::contains(
      text, {"all-reduce explained, per step (mean over ranks): measured 0.1230 s = "
             "0.0450 s on the calibrated link, idle (0.0030 s of it per-message latency; "
             "1 of",
             "they take 0.1300 s). Exposed after backward: measured",
             "readies it on the last rank to get there, 0.0060 s after the mean rank"}));
  r.comm_explained.beyond = -0.002;
  std::ostringstream faster;
  printSummary(faster, {r});
  EXPECT_TRUE(testing::contains(faster.str(),
                                {"arrive - 0.0020 s under the calibrated link's prediction ("}));
  r.comm_explained.busy_probed = false;
  std::ostringstream idle;
  printSummary(idle, {r});
  EXPECT_EQ(idle.str().find("probed while every rank kept a core busy"), std::string::npos)
      << idle.str();
  EXPECT_TRUE(testing::contains(idle.str(), {"on the idle link)"}));
  r.comm_explained.explained = false;
  std::ostringstream again;
  printSummary(again, {r});
  EXPECT_EQ(again.str().find("all-reduce explained"), std::string::npos) << again.str();
}

}  // namespace
}  // namespace collie::train
