// Config::Parse over a fake environment: SCALEOUT_* and their HOROVOD_* twins (Note [Horovod
// variables]), where each value came from, log level names, the notes about HOROVOD_*
// variables that have no effect, and the autotune settings (Note [Autotune]).
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

struct FakeEnv {
  std::map<std::string, std::string> vars;

  Status Parse(Config* c) const {
    std::vector<std::string> horovod;
    for (const auto& kv : vars) {
      if (kv.first.rfind("HOROVOD_", 0) == 0) horovod.push_back(kv.first);
    }
    return Config::Parse(
        [this](const char* name) -> const char* {
          auto it = vars.find(name);
          return it == vars.end() ? nullptr : it->second.c_str();
        },
        horovod, c);
  }
};

bool HasNoteWith(const Config& c, const std::string& fragment) {
  for (const std::string& n : c.notes) {
    if (n.find(fragment) != std::string::npos) return true;
  }
  return false;
}

SO_TEST(ConfigDefaultsComeFromNowhere) {
  Config c;
  ASSERT_TRUE(FakeEnv{}.Parse(&c).ok());
  EXPECT_EQ(c.cycle_time_ms, 1.0);
  EXPECT_EQ(c.stall_shutdown_seconds, 0.0);
  EXPECT_FALSE(c.stall_check_disable);
  EXPECT_FALSE(c.timeline_mark_cycles);
  EXPECT_FALSE(c.stall_shutdown_active());
  EXPECT_EQ(c.sources.at("SCALEOUT_CYCLE_TIME"), "default");
  EXPECT_EQ(c.sources.at("SCALEOUT_SHM"), "default");
  EXPECT_TRUE(c.notes.empty());
}

SO_TEST(ConfigReadsEveryHorovodTwin) {
  FakeEnv env{{{"HOROVOD_FUSION_THRESHOLD", "1048576"},
               {"HOROVOD_CYCLE_TIME", "2.5"},
               {"HOROVOD_CACHE_CAPACITY", "7"},
               {"HOROVOD_TIMELINE", "/tmp/t.json"},
               {"HOROVOD_TIMELINE_MARK_CYCLES", "1"},
               {"HOROVOD_STALL_CHECK_TIME_SECONDS", "5"},
               {"HOROVOD_STALL_CHECK_DISABLE", "1"},
               {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "9"},
               {"HOROVOD_LOG_LEVEL", "INFO"},
               {"HOROVOD_THREAD_AFFINITY", "3,5"}}};
  Config c;
  ASSERT_TRUE(env.Parse(&c).ok());
  EXPECT_EQ(c.fusion_threshold_bytes, 1048576);
  EXPECT_EQ(c.cycle_time_ms, 2.5);
  EXPECT_EQ(c.cache_capacity, 7);
  EXPECT_EQ(c.timeline_path, "/tmp/t.json");
  EXPECT_TRUE(c.timeline_mark_cycles);
  EXPECT_EQ(c.stall_check_seconds, 5.0);
  EXPECT_TRUE(c.stall_check_disable);
  EXPECT_EQ(c.stall_shutdown_seconds, 9.0);
  EXPECT_EQ(c.log_level, 2);
  EXPECT_EQ(c.thread_affinity, (std::vector<int>{3, 5}));
  for (const char* s : {"FUSION_THRESHOLD", "CYCLE_TIME", "CACHE_CAPACITY", "TIMELINE",
                        "TIMELINE_MARK_CYCLES", "STALL_CHECK_TIME_SECONDS", "STALL_CHECK_DISABLE",
                        "STALL_SHUTDOWN_TIME_SECONDS", "LOG_LEVEL", "THREAD_AFFINITY"}) {
    if (!EXPECT_EQ(c.sources.at(std::string("SCALEOUT_") + s), std::string("HOROVOD_") + s)) {
      ADD_FAILURE(std::string("source of ") + s);
    }
  }
  EXPECT_TRUE(c.notes.empty());  // every one of them is honoured
}

SO_TEST(ConfigScaleoutWinsOverHorovod) {
  FakeEnv env{{{"SCALEOUT_CYCLE_TIME", "4"},
               {"HOROVOD_CYCLE_TIME", "8"},
               {"SCALEOUT_CACHE_CAPACITY", "3"},
               {"HOROVOD_CACHE_CAPACITY", "3"}}};
  Config c;
  ASSERT_TRUE(env.Parse(&c).ok());
  EXPECT_EQ(c.cycle_time_ms, 4.0);
  EXPECT_EQ(c.sources.at("SCALEOUT_CYCLE_TIME"), "SCALEOUT_CYCLE_TIME");
  EXPECT_TRUE(HasNoteWith(c, "HOROVOD_CYCLE_TIME=8 has no effect: SCALEOUT_CYCLE_TIME=4"));
  EXPECT_FALSE(HasNoteWith(c, "HOROVOD_CACHE_CAPACITY"));  // same value: nothing to say
}

SO_TEST(ConfigNamesTheHorovodVariableOfABadValue) {
  Config c;
  Status s = FakeEnv{{{"HOROVOD_CYCLE_TIME", "fast"}}}.Parse(&c);
  EXPECT_EQ(s.code(), SO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(s.message().find("HOROVOD_CYCLE_TIME='fast'") != std::string::npos);
  s = FakeEnv{{{"HOROVOD_LOG_LEVEL", "loud"}}}.Parse(&c);
  EXPECT_TRUE(s.message().find("HOROVOD_LOG_LEVEL='loud' is not a log level") != std::string::npos);
  s = FakeEnv{{{"SCALEOUT_THREAD_AFFINITY", "1,x"}}}.Parse(&c);
  EXPECT_TRUE(s.message().find("SCALEOUT_THREAD_AFFINITY='1,x'") != std::string::npos);
}

SO_TEST(ConfigLogLevelNamesAndNumbers) {
  int level = -1;
  const std::pair<const char*, int> cases[] = {{"trace", 3},   {"DEBUG", 3}, {"Info", 2},
                                               {"warning", 1}, {"ERROR", 0}, {"fatal", 0},
                                               {"0", 0},       {"2", 2},     {"7", 3}};
  for (const auto& c : cases) {
    if (!EXPECT_TRUE(ParseLogLevel(c.first, &level)) || !EXPECT_EQ(level, c.second)) {
      ADD_FAILURE(std::string("log level ") + c.first);
    }
  }
  EXPECT_FALSE(ParseLogLevel("", &level));
  EXPECT_FALSE(ParseLogLevel("-1", &level));
  EXPECT_FALSE(ParseLogLevel("verbose", &level));
  Config c;
  ASSERT_TRUE((FakeEnv{{{"SCALEOUT_LOG_LEVEL", "debug"}}}.Parse(&c).ok()));
  EXPECT_EQ(c.log_level, 3);
}

SO_TEST(ConfigNotesEveryHorovodVariableWithoutEffect) {
  FakeEnv env{{{"HOROVOD_CONTROLLER", "gloo"},
               {"HOROVOD_MPI_THREADS_DISABLE", "1"},
               {"HOROVOD_GPU_OPERATIONS", "NCCL"},
               {"HOROVOD_WITH_PYTORCH", "1"},
               {"HOROVOD_NOT_A_REAL_KNOB", "1"},
               {"HOROVOD_CYCLE_TIME", "2"},
               // Set by scaleoutrun as by horovodrun, for the program: no note.
               {"HOROVOD_RANK", "3"},
               {"HOROVOD_HOSTNAME", "a"},
               {"HOROVOD_CROSS_SIZE", "2"}}};
  Config c;
  ASSERT_TRUE(env.Parse(&c).ok());
  EXPECT_EQ(c.notes.size(), 5);
  EXPECT_TRUE(HasNoteWith(c, "HOROVOD_CONTROLLER is set but has no effect"));
  EXPECT_TRUE(HasNoteWith(c, "HOROVOD_MPI_THREADS_DISABLE is set but has no effect"));
  EXPECT_TRUE(HasNoteWith(c, "HOROVOD_GPU_OPERATIONS is set but has no effect"));
  EXPECT_TRUE(HasNoteWith(
      c, "HOROVOD_WITH_PYTORCH is set but has no effect: it configures Horovod's build"));
  EXPECT_TRUE(
      HasNoteWith(c, "HOROVOD_NOT_A_REAL_KNOB is set but has no effect: it is not a Horovod"));
  EXPECT_FALSE(HasNoteWith(c, "HOROVOD_CYCLE_TIME"));
}

SO_TEST(ConfigHierarchicalAllreduceIsAutoOneOrZeroWithItsHorovodTwin) {
  Config c;
  ASSERT_TRUE((FakeEnv{{}}).Parse(&c).ok());
  EXPECT_EQ(c.hierarchical_allreduce, -1);
  ASSERT_TRUE(
      (FakeEnv{{{"HOROVOD_HIERARCHICAL_ALLREDUCE", "0"}, {"HOROVOD_HIERARCHICAL_ALLGATHER", "1"}}})
          .Parse(&c)
          .ok());
  EXPECT_EQ(c.hierarchical_allreduce, 0);
  EXPECT_EQ(c.hierarchical_allgather, 1);
  EXPECT_TRUE(c.notes.empty());
  ASSERT_TRUE(
      (FakeEnv{{{"HOROVOD_HIERARCHICAL_ALLREDUCE", "0"}, {"SCALEOUT_HIERARCHICAL_ALLREDUCE", "1"}}})
          .Parse(&c)
          .ok());
  EXPECT_EQ(c.hierarchical_allreduce, 1);
  Status bad = (FakeEnv{{{"SCALEOUT_HIERARCHICAL_ALLREDUCE", "yes"}}}).Parse(&c);
  EXPECT_EQ(bad.code(), SO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(bad.message().find("is not auto, 1 or 0") != std::string::npos);
}

SO_TEST(ConfigStallShutdownFollowsHorovodRules) {
  Config c;
  ASSERT_TRUE((FakeEnv{
      {{"SCALEOUT_STALL_CHECK_TIME_SECONDS", "2"}, {"SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS", "3"}}}
                   .Parse(&c)
                   .ok()));
  EXPECT_TRUE(c.stall_shutdown_active());
  // Shorter than the check time: only warnings, and a note saying so.
  ASSERT_TRUE((FakeEnv{{{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "5"}}}.Parse(&c).ok()));
  EXPECT_FALSE(c.stall_shutdown_active());
  EXPECT_TRUE(HasNoteWith(c, "less than the stall check time"));
  ASSERT_TRUE((FakeEnv{{{"SCALEOUT_STALL_CHECK_TIME_SECONDS", "2"},
                        {"SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS", "3"},
                        {"SCALEOUT_STALL_CHECK_DISABLE", "1"}}}
                   .Parse(&c)
                   .ok()));
  EXPECT_FALSE(c.stall_shutdown_active());
}

SO_TEST(ConfigCoordinatorCoreIsThisLocalRanksEntry) {
  Config c;
  ASSERT_TRUE((FakeEnv{{{"HOROVOD_THREAD_AFFINITY", "4,6,8"}}}.Parse(&c).ok()));
  std::string why;
  EXPECT_EQ(c.CoordinatorCore(1, 3, &why), 6);
  EXPECT_EQ(c.CoordinatorCore(0, 2, &why), 4);  // extra entries are ignored, as in Horovod
  EXPECT_TRUE(why.empty());
  EXPECT_EQ(c.CoordinatorCore(0, 4, &why), -1);
  EXPECT_TRUE(why.find("HOROVOD_THREAD_AFFINITY lists 3 CPUs") != std::string::npos);
  Config none;
  EXPECT_EQ(none.CoordinatorCore(0, 1, &why), -1);
}

SO_TEST(ConfigToStringNamesEachSource) {
  Config c;
  ASSERT_TRUE((FakeEnv{{{"HOROVOD_CYCLE_TIME", "2"}, {"SCALEOUT_SHM", "0"}}}.Parse(&c).ok()));
  const std::string text = c.ToString();
  EXPECT_TRUE(text.find("SCALEOUT_CYCLE_TIME=2\nSCALEOUT_CYCLE_TIME.source=HOROVOD_CYCLE_TIME\n") !=
              std::string::npos);
  EXPECT_TRUE(text.find("SCALEOUT_SHM=0\nSCALEOUT_SHM.source=SCALEOUT_SHM\n") != std::string::npos);
  EXPECT_TRUE(text.find("SCALEOUT_FUSION_THRESHOLD.source=default\n") != std::string::npos);
}

// Note [Settings table]: config()'s settings and their defaults are the table's rows, in order.
SO_TEST(ConfigSettingsAreTheTablesRowsWithItsDefaults) {
  Config c;
  ASSERT_TRUE(FakeEnv{}.Parse(&c).ok());
  std::vector<std::pair<std::string, std::string>> shown;
  std::istringstream lines(c.ToString());
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    const std::string key = line.substr(0, eq);
    if (key.rfind("SCALEOUT_", 0) != 0 || key.find('.') != std::string::npos) continue;
    shown.emplace_back(key, line.substr(eq + 1));
  }
  const std::vector<std::pair<std::string, std::string>> table = {
#define SO_ROW_(SUFFIX, twin, default_text, description) {"SCALEOUT_" #SUFFIX, default_text},
      SO_SETTINGS_TABLE(SO_ROW_)
#undef SO_ROW_
  };
  ASSERT_EQ(shown.size(), table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(shown[i].first, table[i].first);
    EXPECT_EQ(shown[i].second, table[i].second);
  }
}

// A twin is read from its HOROVOD_* name (1 is a valid value of each); another setting is not.
SO_TEST(ConfigTwinsAreTheTablesTwins) {
  struct Row {
    const char* suffix;
    bool twin;
  };
  const Row rows[] = {
#define SO_ROW_(SUFFIX, twin, default_text, description) {#SUFFIX, twin != 0},
      SO_SETTINGS_TABLE(SO_ROW_)
#undef SO_ROW_
  };
  for (const Row& row : rows) {
    const std::string mine = std::string("SCALEOUT_") + row.suffix;
    const std::string theirs = std::string("HOROVOD_") + row.suffix;
    FakeEnv env;
    env.vars[theirs] = "1";
    Config c;
    ASSERT_TRUE(env.Parse(&c).ok());
    if (!EXPECT_EQ(c.sources[mine], row.twin ? theirs : std::string("default"))) ADD_FAILURE(mine);
  }
}

SO_TEST(AutotuneSettingsReadHorovodsVariables) {
  Config c;
  ASSERT_TRUE((FakeEnv{{{"HOROVOD_AUTOTUNE", "1"},
                        {"HOROVOD_AUTOTUNE_LOG", "/tmp/tune.csv"},
                        {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "0"},
                        {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "4"},
                        {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "30"},
                        {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.2"}}}
                   .Parse(&c)
                   .ok()));
  EXPECT_TRUE(c.autotune);
  EXPECT_EQ(c.autotune_log, "/tmp/tune.csv");
  EXPECT_EQ(c.autotune_warmup_samples, 0);
  EXPECT_EQ(c.autotune_steps_per_sample, 4);
  EXPECT_EQ(c.autotune_max_samples, 30);
  EXPECT_NEAR(c.autotune_noise, 0.2, 1e-12);
  EXPECT_TRUE(c.notes.empty());
  Config d;
  ASSERT_TRUE((FakeEnv{{}}.Parse(&d).ok()));
  EXPECT_FALSE(d.autotune);
  EXPECT_EQ(d.autotune_max_samples, 16);
}

SO_TEST(AutotuneSettingsOutOfRangeNameTheVariable) {
  const std::pair<const char*, const char*> bad[] = {
      {"HOROVOD_AUTOTUNE", "yes"},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "-1"},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "0"},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "2.5"},
      {"SCALEOUT_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "0"},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "101"},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "-0.1"},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "inf"},
  };
  for (const auto& [name, value] : bad) {
    Config c;
    FakeEnv env{{{name, value}}};
    env.vars.emplace("SCALEOUT_AUTOTUNE", "1");  // not where the bad value is HOROVOD_AUTOTUNE's
    if (std::string(name) == "HOROVOD_AUTOTUNE") env.vars.erase("SCALEOUT_AUTOTUNE");
    const Status s = env.Parse(&c);
    if (!EXPECT_FALSE(s.ok())) {
      ADD_FAILURE(std::string(name) + "=" + value + " was accepted");
      continue;
    }
    EXPECT_EQ(s.code(), SO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(s.message().find(std::string(name) + "='" + value + "'"), std::string::npos);
  }
}

SO_TEST(AutotuneWithAFixedSettingSaysTheFixedOneWins) {
  Config c;
  ASSERT_TRUE((FakeEnv{{{"HOROVOD_AUTOTUNE", "1"}, {"HOROVOD_FUSION_THRESHOLD", "1048576"}}}
                   .Parse(&c)
                   .ok()));
  EXPECT_TRUE(HasNoteWith(c, "autotune leaves HOROVOD_FUSION_THRESHOLD as set (1048576 bytes"));
  EXPECT_TRUE(HasNoteWith(c, "tunes only the cycle time"));
  Config both;
  ASSERT_TRUE((FakeEnv{
      {{"SCALEOUT_AUTOTUNE", "1"}, {"SCALEOUT_FUSION_THRESHOLD", "0"}, {"HOROVOD_CYCLE_TIME", "5"}}}
                   .Parse(&both)
                   .ok()));
  EXPECT_TRUE(HasNoteWith(both, "autotune has nothing to tune"));
  Config off;
  ASSERT_TRUE((FakeEnv{{{"HOROVOD_AUTOTUNE_LOG", "/tmp/x.csv"}}}.Parse(&off).ok()));
  EXPECT_TRUE(HasNoteWith(off, "HOROVOD_AUTOTUNE_LOG is set but has no effect: autotuning is off"));
}

}  // namespace
}  // namespace scaleout
