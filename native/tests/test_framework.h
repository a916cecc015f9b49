// A minimal unit-test framework for the native core: no dependency, one header.
//
//   #include "tests/test_framework.h"
//
//   SO_TEST(ReduceSumFloat32) {          // defines and registers a test; names are identifiers
//     std::vector<float> a = {1, 2};
//     ASSERT_EQ(a.size(), 2);            // on failure: report, then return from the function
//     EXPECT_EQ(a[0] + a[1], 3.0f);      // on failure: report, and the test goes on
//     EXPECT_NEAR(a[0] / 3, 0.333, 1e-3);
//     EXPECT_THROW(Parse("x"), scaleout::InternalError);
//   }
//
// Checks: EXPECT_TRUE(c), EXPECT_FALSE(c), EXPECT_EQ(a, b), EXPECT_NE(a, b),
// EXPECT_NEAR(a, b, tolerance), EXPECT_THROW(statement, ExceptionType), ADD_FAILURE(message)
// (a failure with your own std::string message), and ASSERT_TRUE(c), ASSERT_EQ(a, b).
// - Each argument is evaluated once. EXPECT_TRUE/FALSE/EQ/NE/NEAR are expressions that return
//   whether the check held: `if (!EXPECT_EQ(x, y)) ADD_FAILURE("at i=" + std::to_string(i));`
// - EQ/NE compare with == (integers of mixed signedness compare by value, so
//   EXPECT_EQ(v.size(), 3) is fine) and print both values when they can be printed.
// - ASSERT_* leave the current function with `return;`: use them in the test body or in a
//   void helper.
// - Checks may be made from several threads of one test.
//
// tests/test_main.cc runs every test, or those whose name contains its argument, or (with
// `--file test_x.cc`) those defined in one file. It prints one line per failed check, `file:line:
// [TestName] message` (at most 25 per test, then a count), and last of all `N passed, M failed`,
// counted in tests. The exit code is 0 only when no test failed (and at least one ran).
#ifndef SCALEOUT_TESTS_TEST_FRAMEWORK_H_
#define SCALEOUT_TESTS_TEST_FRAMEWORK_H_

#include <cmath>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace scaleout {
namespace test {

using TestFunction = void (*)();

// Adds a test to the registry; returns true so that SO_TEST can call it in a static initialiser.
bool RegisterTest(const char* name, TestFunction function, const char* file, int line);

// Records a failed check against the running test (thread-safe).
void ReportFailure(const char* file, int line, const std::string& message);

namespace detail {

template <typename T, typename = void>
struct IsPrintable : std::false_type {};
template <typename T>
struct IsPrintable<T,
                   std::void_t<decltype(std::declval<std::ostream&>() << std::declval<const T&>())>>
    : std::true_type {};

template <typename T>
std::string Describe(const T& value) {
  std::ostringstream out;
  if constexpr (std::is_same_v<T, bool>) {
    out << (value ? "true" : "false");
  } else if constexpr (std::is_enum_v<T>) {
    out << static_cast<long long>(value);
  } else if constexpr (std::is_integral_v<T> && sizeof(T) == 1) {
    out << static_cast<int>(value);  // a number, not a character
  } else if constexpr (std::is_floating_point_v<T>) {
    out.precision(17);
    out << value;
  } else if constexpr (IsPrintable<T>::value) {
    out << value;
  } else {
    out << "(" << sizeof(T) << "-byte value)";
  }
  return out.str();
}

template <typename A, typename B>
bool Equal(const A& a, const B& b) {
  if constexpr (std::is_integral_v<A> && std::is_integral_v<B> &&
                std::is_signed_v<A> != std::is_signed_v<B>) {
    if constexpr (std::is_signed_v<A>) {
      return a >= 0 && static_cast<std::make_unsigned_t<A>>(a) == b;
    } else {
      return b >= 0 && a == static_cast<std::make_unsigned_t<B>>(b);
    }
  } else {
    return a == b;
  }
}

template <typename A, typename B>
bool CheckEqual(bool want_equal, const A& a, const B& b, const char* macro, const char* a_text,
                const char* b_text, const char* file, int line) {
  if (Equal(a, b) == want_equal) return true;
  ReportFailure(file, line,
                std::string(macro) + "(" + a_text + ", " + b_text + ") failed: " + Describe(a) +
                    (want_equal ? " vs " : " == ") + Describe(b));
  return false;
}

inline bool CheckTrue(bool value, bool want, const char* macro, const char* text, const char* file,
                      int line) {
  if (value == want) return true;
  ReportFailure(file, line, std::string(macro) + "(" + text + ") failed");
  return false;
}

inline bool CheckNear(double a, double b, double tolerance, const char* a_text, const char* b_text,
                      const char* file, int line) {
  if (std::fabs(a - b) <= tolerance) return true;  // false for NaN
  ReportFailure(file, line,
                std::string("EXPECT_NEAR(") + a_text + ", " + b_text + ") failed: " + Describe(a) +
                    " vs " + Describe(b) + ", tolerance " + Describe(tolerance));
  return false;
}

}  // namespace detail
}  // namespace test
}  // namespace scaleout

#define SO_TEST(name)                                                                \
  static void SoTestBody_##name();                                                   \
  [[maybe_unused]] static const bool so_test_registered_##name =                     \
      ::scaleout::test::RegisterTest(#name, &SoTestBody_##name, __FILE__, __LINE__); \
  static void SoTestBody_##name()

#define EXPECT_TRUE(cond)                                                                  \
  ::scaleout::test::detail::CheckTrue(static_cast<bool>(cond), true, "EXPECT_TRUE", #cond, \
                                      __FILE__, __LINE__)
#define EXPECT_FALSE(cond)                                                                   \
  ::scaleout::test::detail::CheckTrue(static_cast<bool>(cond), false, "EXPECT_FALSE", #cond, \
                                      __FILE__, __LINE__)
#define EXPECT_EQ(a, b) \
  ::scaleout::test::detail::CheckEqual(true, (a), (b), "EXPECT_EQ", #a, #b, __FILE__, __LINE__)
#define EXPECT_NE(a, b) \
  ::scaleout::test::detail::CheckEqual(false, (a), (b), "EXPECT_NE", #a, #b, __FILE__, __LINE__)
#define EXPECT_NEAR(a, b, tolerance)                                                  \
  ::scaleout::test::detail::CheckNear(static_cast<double>(a), static_cast<double>(b), \
                                      static_cast<double>(tolerance), #a, #b, __FILE__, __LINE__)

#define ADD_FAILURE(message) ::scaleout::test::ReportFailure(__FILE__, __LINE__, (message))

#define EXPECT_THROW(statement, exception_type)                                       \
  do {                                                                                \
    bool so_test_threw_ = false;                                                      \
    try {                                                                             \
      statement;                                                                      \
    } catch (const exception_type&) {                                                 \
      so_test_threw_ = true;                                                          \
    } catch (...) {                                                                   \
    }                                                                                 \
    if (!so_test_threw_) {                                                            \
      ::scaleout::test::ReportFailure(__FILE__, __LINE__,                             \
                                      "EXPECT_THROW(" #statement ", " #exception_type \
                                      ") failed: no such exception");                 \
    }                                                                                 \
  } while (0)

#define ASSERT_TRUE(cond)                                                                         \
  do {                                                                                            \
    if (!::scaleout::test::detail::CheckTrue(static_cast<bool>(cond), true, "ASSERT_TRUE", #cond, \
                                             __FILE__, __LINE__))                                 \
      return;                                                                                     \
  } while (0)
#define ASSERT_EQ(a, b)                                                                      \
  do {                                                                                       \
    if (!::scaleout::test::detail::CheckEqual(true, (a), (b), "ASSERT_EQ", #a, #b, __FILE__, \
                                              __LINE__))                                     \
      return;                                                                                \
  } while (0)

#endif  // SCALEOUT_TESTS_TEST_FRAMEWORK_H_
