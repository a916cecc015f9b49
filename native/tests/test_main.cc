// Runs the tests registered with SO_TEST (see tests/test_framework.h).
//
//   native_tests                           every test
//   native_tests Reduce                    the tests whose name contains "Reduce"
//   native_tests --file test_adasum.cc     the tests defined in that file (its base name)
//   native_tests --file test_adasum.cc Sum both filters at once
//   native_tests --list                    `file test` per registered test, running none
//
// Prints one line per failed check (at most kMaxLinesPerTest per test, then a count) and, as
// the last line, `N passed, M failed`. Exit code 0 only when no test failed and at least one
// ran (a filter that matches nothing is more likely a typo than a success, and a file with no
// tests has lost them: tests/test_native_unit.py runs each file on its own).
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace test {
namespace {

constexpr int kMaxLinesPerTest = 25;

struct TestCase {
  const char* name;
  TestFunction function;
  const char* file;
  int line;
};

// Function-local statics: registration runs during static initialisation of other files.
std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct RunState {
  std::mutex mutex;
  const TestCase* current = nullptr;
  int failures = 0;  // failed checks in the current test
};

RunState& State() {
  static RunState state;
  return state;
}

void PrintLine(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// __FILE__ is the path the compiler was given, which depends on how the build named it.
std::string BaseName(const char* path) {
  const std::string text = path;
  const auto slash = text.find_last_of('/');
  return slash == std::string::npos ? text : text.substr(slash + 1);
}

}  // namespace

bool RegisterTest(const char* name, TestFunction function, const char* file, int line) {
  Registry().push_back(TestCase{name, function, file, line});
  return true;
}

void ReportFailure(const char* file, int line, const std::string& message) {
  RunState& state = State();
  std::lock_guard<std::mutex> lock(state.mutex);
  ++state.failures;
  if (state.failures > kMaxLinesPerTest) return;
  const char* test_name = state.current ? state.current->name : "(outside any test)";
  PrintLine(std::string(file) + ":" + std::to_string(line) + ": [" + test_name + "] " + message);
}

namespace {

// Runs one test; returns the number of failed checks.
int RunOne(const TestCase& test) {
  RunState& state = State();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.current = &test;
    state.failures = 0;
  }
  try {
    test.function();
  } catch (const InternalError& e) {
    ReportFailure(test.file, test.line, "unexpected scaleout::InternalError: " + e.message);
  } catch (const std::exception& e) {
    ReportFailure(test.file, test.line, std::string("unexpected exception: ") + e.what());
  } catch (...) {
    ReportFailure(test.file, test.line, "unexpected exception of unknown type");
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.failures > kMaxLinesPerTest) {
    PrintLine(std::string(test.file) + ":" + std::to_string(test.line) + ": [" + test.name +
              "] ... and " + std::to_string(state.failures - kMaxLinesPerTest) +
              " more failed checks");
  }
  state.current = nullptr;
  return state.failures;
}

}  // namespace
}  // namespace test
}  // namespace scaleout

int main(int argc, char** argv) {
  using scaleout::test::Registry;
  std::string file;    // empty: every file
  std::string filter;  // empty: every name
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--file" && i + 1 < argc) {
      file = argv[++i];
    } else if (arg == "--list") {
      list = true;
    } else {
      filter = arg;
    }
  }
  if (list) {
    for (const auto& test : Registry()) {
      scaleout::test::PrintLine(scaleout::test::BaseName(test.file) + " " + test.name);
    }
    return 0;
  }
  int passed = 0;
  int failed = 0;
  for (const auto& test : Registry()) {
    if (std::string(test.name).find(filter) == std::string::npos) continue;
    if (!file.empty() && scaleout::test::BaseName(test.file) != file) continue;
    if (scaleout::test::RunOne(test) == 0) {
      ++passed;
    } else {
      ++failed;
    }
  }
  if (passed + failed == 0) {
    scaleout::test::PrintLine(file.empty() ? "no test name contains \"" + filter + "\""
                                           : "no test in " + file + " whose name contains \"" +
                                                 filter + "\"");
  }
  scaleout::test::PrintLine(std::to_string(passed) + " passed, " + std::to_string(failed) +
                            " failed");
  return failed == 0 && passed > 0 ? 0 : 1;
}
