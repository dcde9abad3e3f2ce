// SPDX-License-Identifier: Apache-2.0
// The observing store decorator and basic_metrics: forwarding, counting, and valid Prometheus text.
#include "ratelimit/store/observed_store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/errors.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/compound.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/store/blocked_cache.hpp"
#include "ratelimit/store/memory_store.hpp"

#ifndef RATELIMIT_METRICS_EXAMPLE
#define RATELIMIT_METRICS_EXAMPLE ""
#endif

namespace {

using namespace std::chrono_literals;
using ratelimit::access;
using ratelimit::basic_metrics;
using ratelimit::decision;
using ratelimit::decision_source;
using ratelimit::fixed_window;
using ratelimit::memory_store;
using ratelimit::observation;
using ratelimit::observed_store;
using ratelimit::timestamp;
using ratelimit::units;

/// A store that answers a scripted decision, or throws, and counts resets;
/// it also offers the store-clock form.
struct scripted_store {
  decision next;
  bool fail = false;
  int resets = 0;

  template <class Config>
  decision apply(const Config&, std::string_view, timestamp, units, access) {
    return answer();
  }
  template <class Config>
  decision apply(const Config&, std::string_view, ratelimit::store_time_t, units, access) {
    return answer();
  }
  template <class Config>
  void reset(const Config&, std::string_view) {
    ++resets;
  }

 private:
  decision answer() const {
    if (fail) throw ratelimit::store_error("scripted store is down");
    return next;
  }
};

/// A marker clock: the store reads its own time.
struct server_clock {
  static constexpr bool reads_store_time = true;
};

/// Remembers every observation (single-threaded tests only).
struct recording_observer {
  std::vector<observation> seen;
  std::vector<decision> decisions;
  int errors = 0;
  void on_decision(const observation& o, const decision& d) {
    seen.push_back(o);
    decisions.push_back(d);
  }
  void on_error(const observation& o) {
    seen.push_back(o);
    ++errors;
  }
};

/// As recording_observer, and asks for keys.
struct key_observer : recording_observer {
  static constexpr bool wants_key = true;
};

/// Implements only the mandatory hook.
struct minimal_observer {
  int calls = 0;
  void on_decision(const observation&, const decision&) { ++calls; }
};

using fw_store = memory_store<fixed_window>;
static_assert(ratelimit::decision_observer<basic_metrics>);
static_assert(ratelimit::decision_observer<minimal_observer>);
static_assert(!ratelimit::decision_observer<int>);
static_assert(ratelimit::observer_handle<basic_metrics*>);
static_assert(ratelimit::observer_handle<std::shared_ptr<basic_metrics>>);
static_assert(ratelimit::observer_handle<std::reference_wrapper<basic_metrics>>);
static_assert(!ratelimit::observer_handle<int*>);
static_assert(ratelimit::store_for<observed_store<fw_store, basic_metrics*>, fixed_window>);
static_assert(ratelimit::store_for<observed_store<fw_store, minimal_observer>, fixed_window>);
static_assert(
    !ratelimit::store_clocked_store_for<observed_store<fw_store, basic_metrics*>, fixed_window>);
static_assert(!ratelimit::store_for<observed_store<fw_store, basic_metrics*>, ratelimit::gcra>);
static_assert(ratelimit::store_clocked_store_for<observed_store<scripted_store, basic_metrics*>,
                                                 fixed_window>);
static_assert(ratelimit::store_for<
              observed_store<memory_store<ratelimit::compound_of<ratelimit::gcra>>, basic_metrics*>,
              ratelimit::compound_of<ratelimit::gcra>>);

using observed_fw = observed_store<fw_store, basic_metrics*>;

/// As scripted_store, and refuses unnamed configs as the Redis stores do.
struct named_only_store : scripted_store {
  template <class Config>
  static void check_config(const Config& cfg) {
    if (cfg.name().empty()) throw std::invalid_argument("named_only_store: unnamed config");
  }
};

// Verifies that the decorators forward the wrapped store's config check, so
// a limiter over an observed (and cached) Redis store refuses an unnamed
// config at construction, not at its first check.
TEST(ObservedStore, ForwardsTheWrappedStoresConfigCheck) {
  using observed = observed_store<named_only_store, minimal_observer>;
  using cached = ratelimit::blocked_cache<named_only_store>;
  using observed_cached = observed_store<cached, minimal_observer>;
  const fixed_window::config unnamed{"2/s"};
  const fixed_window::config named{"2/s", ratelimit::window_options{.name = "api"}};
  EXPECT_THROW((ratelimit::limiter<fixed_window, observed, server_clock>(
                   unnamed, observed{named_only_store{}, minimal_observer{}})),
               std::invalid_argument);
  EXPECT_THROW((ratelimit::limiter<fixed_window, observed_cached, server_clock>(
                   unnamed, observed_cached{cached{named_only_store{}}, minimal_observer{}})),
               std::invalid_argument);
  EXPECT_NO_THROW((ratelimit::limiter<fixed_window, observed, server_clock>(
      named, observed{named_only_store{}, minimal_observer{}})));
  EXPECT_NO_THROW((ratelimit::limiter<fixed_window, observed_cached, server_clock>(
      named, observed_cached{cached{named_only_store{}}, minimal_observer{}})));
}

TEST(ObservedStore, ForwardsDecisionsUnchangedAndCountsThem) {
  basic_metrics metrics;
  ratelimit::limiter<fixed_window, observed_fw> lim(fixed_window::config{"2/s"},
                                                    observed_fw{fw_store{}, &metrics});
  ratelimit::limiter<fixed_window> plain(fixed_window::config{"2/s"});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lim.try_acquire("k", timestamp{5}), plain.try_acquire("k", timestamp{5}));
  }
  EXPECT_EQ(lim.peek("k", timestamp{6}), plain.peek("k", timestamp{6}));
  lim.reset("k");
  EXPECT_EQ(lim.store().inner().size(), 0U);

  const basic_metrics::reading r = metrics.read();
  EXPECT_EQ(r.allowed, 2U);
  EXPECT_EQ(r.rejected, 1U);
  EXPECT_EQ(r.peeks, 1U);
  EXPECT_EQ(r.degraded(), 0U);
  EXPECT_EQ(r.cache_hits, 0U);
  EXPECT_EQ(r.errors, 0U);
  EXPECT_EQ(r.timed(), 4U);  // resets are not timed
}

TEST(ObservedStore, ReportsPolicyModeAndCostButNoKeyByDefault) {
  using store = observed_store<fw_store, recording_observer>;
  ratelimit::limiter<fixed_window, store> lim(fixed_window::config{"10/s"},
                                              store{fw_store{}, recording_observer{}});
  (void)lim.try_acquire("secret-user-id", timestamp{1}, 3);
  (void)lim.peek("secret-user-id", timestamp{1});
  const auto& seen = lim.store().observer().seen;
  ASSERT_EQ(seen.size(), 2U);
  EXPECT_EQ(seen[0].policy, "fixed_window");
  EXPECT_EQ(seen[0].mode, access::consume);
  EXPECT_EQ(seen[0].cost, 3);
  EXPECT_TRUE(seen[0].key.empty());
  EXPECT_GE(seen[0].latency, 0ns);
  EXPECT_EQ(seen[1].mode, access::peek);
  EXPECT_EQ(lim.store().observer().decisions[0].remaining, 7);
}

TEST(ObservedStore, PassesTheKeyOnlyToObserversThatAskForIt) {
  using store = observed_store<fw_store, key_observer>;
  ratelimit::limiter<fixed_window, store> lim(fixed_window::config{"10/s"},
                                              store{fw_store{}, key_observer{}});
  (void)lim.try_acquire("user:42", timestamp{1});
  ASSERT_EQ(lim.store().observer().seen.size(), 1U);
  EXPECT_EQ(lim.store().observer().seen[0].key, "user:42");
}

TEST(ObservedStore, NamesTheCompoundPolicy) {
  using policy = ratelimit::compound_of<ratelimit::sliding_window_log>;
  using store = observed_store<memory_store<policy>, recording_observer>;
  ratelimit::limiter<policy, store> lim(policy::config{"10/15min", "100/day"},
                                        store{memory_store<policy>{}, recording_observer{}});
  (void)lim.try_acquire("k", timestamp{1});
  EXPECT_EQ(lim.store().observer().seen.at(0).policy, "compound");
}

// Verifies that a throwing store is counted as an error, its latency timed,
// and the very exception rethrown.
TEST(ObservedStore, CountsAndRethrowsStoreErrors) {
  basic_metrics metrics;
  using store = observed_store<scripted_store, basic_metrics*>;
  ratelimit::limiter<fixed_window, store> lim(fixed_window::config{"10/s"},
                                              store{scripted_store{}, &metrics});
  lim.store().inner().fail = true;
  EXPECT_THROW((void)lim.try_acquire("k", timestamp{1}), ratelimit::store_error);
  EXPECT_THROW((void)lim.peek("k", timestamp{1}), ratelimit::store_error);
  const basic_metrics::reading r = metrics.read();
  EXPECT_EQ(r.errors, 2U);
  EXPECT_EQ(r.allowed + r.rejected + r.peeks, 0U);
  EXPECT_EQ(r.timed(), 2U);
}

TEST(ObservedStore, ObserverWithoutOnErrorStillRethrows) {
  using store = observed_store<scripted_store, minimal_observer>;
  store s{scripted_store{}, minimal_observer{}};
  s.inner().fail = true;
  const fixed_window::config cfg{"10/s"};
  EXPECT_THROW((void)s.apply(cfg, "k", timestamp{1}, 1, access::consume), ratelimit::store_error);
  EXPECT_EQ(s.observer().calls, 0);
}

TEST(ObservedStore, ForwardsTheStoreClockFormAndReset) {
  basic_metrics metrics;
  using store = observed_store<scripted_store, std::reference_wrapper<basic_metrics>>;
  ratelimit::limiter<fixed_window, store, server_clock> lim(
      fixed_window::config{"10/s"}, store{scripted_store{}, std::ref(metrics)});
  lim.store().inner().next.allowed = true;
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  lim.reset("k");
  EXPECT_EQ(lim.store().inner().resets, 1);
  EXPECT_EQ(metrics.read().allowed, 1U);
}

TEST(BasicMetrics, CountsDegradedDecisionsBySourceAndCacheHits) {
  basic_metrics metrics;
  observation obs;
  decision d;
  d.allowed = true;
  d.source = decision_source::fail_open;
  metrics.on_decision(obs, d);
  d.allowed = false;
  d.source = decision_source::fail_closed;
  metrics.on_decision(obs, d);
  d.source = decision_source::fallback;
  metrics.on_decision(obs, d);
  d.source = decision_source::local_cache;
  metrics.on_decision(obs, d);
  d.source = decision_source::store;
  metrics.on_decision(obs, d);
  const basic_metrics::reading r = metrics.read();
  EXPECT_EQ(r.allowed, 1U);
  EXPECT_EQ(r.rejected, 4U);
  EXPECT_EQ(r.fail_open, 1U);
  EXPECT_EQ(r.fail_closed, 1U);
  EXPECT_EQ(r.fallback, 1U);
  EXPECT_EQ(r.degraded(), 3U);
  EXPECT_EQ(r.cache_hits, 1U);
}

TEST(BasicMetrics, CountsAFullMemoryStoreAsDegraded) {
  basic_metrics metrics;
  ratelimit::memory_store_options full;
  full.max_keys = 1;
  full.on_full = ratelimit::when_full::fail_closed;
  ratelimit::limiter<fixed_window, observed_fw> lim(fixed_window::config{"10/s"},
                                                    observed_fw{fw_store{full}, &metrics});
  EXPECT_TRUE(lim.try_acquire("a", timestamp{1}).allowed);
  EXPECT_FALSE(lim.try_acquire("b", timestamp{1}).allowed);
  EXPECT_EQ(metrics.read().fail_closed, 1U);
}

TEST(BasicMetrics, PutsLatenciesInPowerOfTwoBuckets) {
  EXPECT_EQ(basic_metrics::bucket_bound(0), 250ns);
  EXPECT_EQ(basic_metrics::bucket_bound(22), 1'048'576'000ns);
  EXPECT_EQ(basic_metrics::bucket_of(0ns), 0U);
  EXPECT_EQ(basic_metrics::bucket_of(-5ns), 0U);
  EXPECT_EQ(basic_metrics::bucket_of(250ns), 0U);
  EXPECT_EQ(basic_metrics::bucket_of(251ns), 1U);
  EXPECT_EQ(basic_metrics::bucket_of(500ns), 1U);
  EXPECT_EQ(basic_metrics::bucket_of(501ns), 2U);
  EXPECT_EQ(basic_metrics::bucket_of(1us), 2U);
  EXPECT_EQ(basic_metrics::bucket_of(1'048'576'000ns), 22U);
  EXPECT_EQ(basic_metrics::bucket_of(1'048'576'001ns), basic_metrics::finite_buckets);
  EXPECT_EQ(basic_metrics::bucket_of(1h), basic_metrics::finite_buckets);
  for (std::size_t i = 1; i < basic_metrics::finite_buckets; ++i) {
    EXPECT_EQ(basic_metrics::bucket_of(basic_metrics::bucket_bound(i)), i);
    EXPECT_EQ(basic_metrics::bucket_of(basic_metrics::bucket_bound(i - 1) + 1ns), i);
  }
}

// ---------------------------------------------------------------------------
// A checker of the Prometheus text exposition format (0.0.4), strict enough
// for what basic_metrics writes.

struct exposition {
  std::vector<std::string> problems;
  /// sample name + labels -> value
  std::map<std::string, double> samples;
};

constexpr double inf = std::numeric_limits<double>::infinity();

exposition parse_exposition(const std::string& text) {
  static const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) \S.*$)");
  static const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram)$)");
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*))"
      R"(\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*)\} (\S+)$)");
  static const std::regex label(R"(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)\")");
  exposition out;
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  // histogram series (labels without le) -> (le, cumulative count) in order
  std::map<std::string, std::vector<std::pair<std::string, double>>> buckets;
  std::map<std::string, double> counts;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  if (text.empty() || text.back() != '\n') out.problems.push_back("does not end with a newline");
  while (std::getline(in, line)) {
    ++n;
    const std::string where = "line " + std::to_string(n) + " \"" + line + "\": ";
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      if (!helped.insert(m[1]).second) out.problems.push_back(where + "second HELP");
      continue;
    }
    if (std::regex_match(line, m, type)) {
      if (!types.emplace(m[1], m[2]).second) out.problems.push_back(where + "second TYPE");
      continue;
    }
    if (!std::regex_match(line, m, sample)) {
      out.problems.push_back(where + "not a HELP, TYPE or sample line");
      continue;
    }
    const std::string name = m[1];
    const std::string labels = m[2];
    const std::string value_text = m[3];
    double value = 0;
    try {
      std::size_t used = 0;
      value = value_text == "+Inf" ? inf : std::stod(value_text, &used);
      if (value_text != "+Inf" && used != value_text.size()) throw std::invalid_argument("junk");
    } catch (const std::exception&) {
      out.problems.push_back(where + "bad value");
      continue;
    }
    if (value < 0) out.problems.push_back(where + "negative value");
    out.samples[name + "{" + labels + "}"] = value;
    // The family: the name itself, or a histogram's name without its suffix.
    std::string family = name;
    for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
      const std::string base = name.substr(0, name.size() - std::min(name.size(), suffix.size()));
      if (name.ends_with(suffix) && types.contains(base) && types[base] == "histogram") {
        family = base;
      }
    }
    if (!types.contains(family)) {
      out.problems.push_back(where + "sample before its TYPE line");
      continue;
    }
    if (types[family] == "counter" && !name.ends_with("_total")) {
      out.problems.push_back(where + "counter not named _total");
    }
    if (types[family] != "histogram") continue;
    std::string series;
    std::string le;
    for (auto it = std::sregex_iterator(labels.begin(), labels.end(), label);
         it != std::sregex_iterator(); ++it) {
      if ((*it)[1] == "le") {
        le = (*it)[2];
      } else {
        series += (*it)[0].str() + ",";
      }
    }
    if (name.ends_with("_bucket")) {
      if (le.empty()) out.problems.push_back(where + "bucket without le");
      buckets[family + "{" + series + "}"].emplace_back(le, value);
    } else if (name.ends_with("_count")) {
      counts[family + "{" + series + "}"] = value;
    }
  }
  for (const auto& [series, list] : buckets) {
    for (std::size_t i = 1; i < list.size(); ++i) {
      const double le_prev = list[i - 1].first == "+Inf" ? inf : std::stod(list[i - 1].first);
      const double le_this = list[i].first == "+Inf" ? inf : std::stod(list[i].first);
      if (!(le_prev < le_this)) out.problems.push_back(series + ": le not increasing");
      if (list[i].second < list[i - 1].second) {
        out.problems.push_back(series + ": cumulative counts decrease");
      }
    }
    if (list.empty() || list.back().first != "+Inf") {
      out.problems.push_back(series + ": no final +Inf bucket");
    } else if (!counts.contains(series) || counts[series] != list.back().second) {
      out.problems.push_back(series + ": +Inf bucket differs from _count");
    }
  }
  return out;
}

std::string problems_of(const exposition& e) {
  std::string out;
  for (const std::string& p : e.problems) out += p + "\n";
  return out;
}

TEST(BasicMetrics, WritesValidPrometheusText) {
  basic_metrics metrics;
  ratelimit::limiter<fixed_window, observed_fw> lim(fixed_window::config{"3/s"},
                                                    observed_fw{fw_store{}, &metrics});
  for (int i = 0; i < 10; ++i) (void)lim.try_acquire("k", timestamp{i});
  (void)lim.peek("k", timestamp{1});
  std::ostringstream text;
  metrics.write_prometheus(text, "memory");
  const exposition e = parse_exposition(text.str());
  EXPECT_TRUE(e.problems.empty()) << problems_of(e) << text.str();
  EXPECT_EQ(e.samples.at(R"(ratelimit_checks_total{store="memory",result="allowed"})"), 3);
  EXPECT_EQ(e.samples.at(R"(ratelimit_checks_total{store="memory",result="rejected"})"), 7);
  EXPECT_EQ(e.samples.at(R"(ratelimit_peeks_total{store="memory"})"), 1);
  EXPECT_EQ(e.samples.at(R"(ratelimit_check_duration_seconds_count{store="memory"})"), 11);
  EXPECT_EQ(e.samples.at(R"(ratelimit_check_duration_seconds_bucket{store="memory",le="+Inf"})"),
            11);
  EXPECT_TRUE(e.samples.contains(
      R"(ratelimit_check_duration_seconds_bucket{store="memory",le="0.00000025"})"));
  EXPECT_TRUE(e.samples.contains(
      R"(ratelimit_check_duration_seconds_bucket{store="memory",le="1.048576"})"));
}

TEST(BasicMetrics, WritesSeveralStoresWithEachFamilyOnceAndEscapedLabels) {
  basic_metrics a;
  basic_metrics b;
  observation obs;
  obs.latency = 3s;  // above every finite bucket
  a.on_decision(obs, decision{});
  std::ostringstream text;
  ratelimit::write_prometheus(text, {{"memory", a}, {"we\"ird\\\nlabel", b}});
  const exposition e = parse_exposition(text.str());
  EXPECT_TRUE(e.problems.empty()) << problems_of(e) << text.str();
  EXPECT_EQ(e.samples.at(R"(ratelimit_checks_total{store="we\"ird\\\nlabel",result="rejected"})"),
            0);
  EXPECT_EQ(
      e.samples.at(R"(ratelimit_check_duration_seconds_bucket{store="memory",le="1.048576"})"), 0);
  EXPECT_EQ(e.samples.at(R"(ratelimit_check_duration_seconds_bucket{store="memory",le="+Inf"})"),
            1);
  EXPECT_EQ(e.samples.at(R"(ratelimit_check_duration_seconds_sum{store="memory"})"), 3);
}

TEST(BasicMetrics, TheCheckerRejectsBrokenText) {
  const std::string broken =
      "# TYPE x histogram\n"
      "x_bucket{le=\"1\"} 5\n"
      "x_bucket{le=\"2\"} 4\n"
      "x_bucket{le=\"+Inf\"} 4\n"
      "x_count{} 6\n"
      "y_total{a=\"1\"} 1\n"
      "garbage\n";
  EXPECT_EQ(parse_exposition(broken).problems.size(), 4U) << problems_of(parse_exposition(broken));
}

// Verifies exact totals when threads share one metrics object through one store.
TEST(BasicMetrics, CountsExactlyUnderConcurrentChecks) {
  basic_metrics metrics;
  ratelimit::limiter<fixed_window, observed_fw> lim(fixed_window::config{"100/1d"},
                                                    observed_fw{fw_store{}, &metrics});
  constexpr int threads = 4;
  constexpr int attempts = 500;
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      for (int j = 0; j < attempts; ++j) {
        (void)lim.try_acquire(j % 2 == 0 ? "shared" : "own:" + std::to_string(i), timestamp{1});
      }
    });
  }
  for (auto& t : pool) t.join();
  const basic_metrics::reading r = metrics.read();
  EXPECT_EQ(r.allowed, 100U + threads * 100U);  // 100 shared, 100 per own key
  EXPECT_EQ(r.allowed + r.rejected, static_cast<std::uint64_t>(threads * attempts));
  EXPECT_EQ(r.timed(), static_cast<std::uint64_t>(threads * attempts));
}

// Verifies the example's whole output parses, with its deterministic counts.
TEST(BasicMetrics, ExampleOutputIsValidPrometheusText) {
  const std::string path = RATELIMIT_METRICS_EXAMPLE;
  if (path.empty()) GTEST_SKIP() << "examples are not built (RATELIMIT_BUILD_EXAMPLES=OFF)";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(("\"" + path + "\"").c_str(), "r"), pclose);
  ASSERT_NE(pipe, nullptr) << "cannot run " << path;
  std::string text;
  char buf[4096];
  while (const std::size_t got = std::fread(buf, 1, sizeof buf, pipe.get())) text.append(buf, got);
  ASSERT_EQ(pclose(pipe.release()), 0) << path << " failed; build it first";
  const exposition e = parse_exposition(text);
  EXPECT_TRUE(e.problems.empty()) << problems_of(e) << text;
  EXPECT_EQ(e.samples.at(R"(ratelimit_checks_total{store="api",result="allowed"})"), 2'200);
  EXPECT_EQ(e.samples.at(R"(ratelimit_checks_total{store="api",result="rejected"})"), 800);
  EXPECT_EQ(e.samples.at(R"(ratelimit_degraded_total{store="api",source="fail_open"})"), 600);
  EXPECT_EQ(e.samples.at(R"(ratelimit_peeks_total{store="login"})"), 300);
  EXPECT_EQ(e.samples.at(R"(ratelimit_check_duration_seconds_count{store="api"})"), 3'000);
  // The shadow-mode limiter: 60 checks per caller in one hour, 20 admitted.
  EXPECT_EQ(e.samples.at(R"(ratelimit_checks_total{store="search",result="allowed"})"), 1'000);
  EXPECT_EQ(e.samples.at(R"(ratelimit_checks_total{store="search",result="shadow_rejected"})"),
            2'000);
  EXPECT_EQ(e.samples.at(R"(ratelimit_checks_total{store="search",result="rejected"})"), 0);
}

}  // namespace
