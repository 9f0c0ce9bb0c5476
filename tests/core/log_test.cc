// The log lines' number formats (core/log.h, core/progress.h): fixed decimals, byte counts in binary units,
// progress amounts.
#include <gtest/gtest.h>

#include "core/log.h"
#include "core/progress.h"

namespace aerie {
namespace {

TEST(LogFormat, FixedDecimals) {
  EXPECT_EQ(format_fixed(2.14017, 3), "2.140");
  EXPECT_EQ(format_fixed(0.5, 0), "0");  // round half to even, as printf
}

TEST(LogFormat, ProgressAmountsKeepSmallFractions) {
  EXPECT_EQ(format_amount(0), "0");
  EXPECT_EQ(format_amount(4096), "4096");
  EXPECT_EQ(format_amount(0.37), "0.37");  // a small job's MiB: was "0 MiB"
  EXPECT_EQ(format_amount(2.5), "2.50");
  EXPECT_EQ(format_amount(12.54), "12.5");
  EXPECT_EQ(format_amount(1234.6), "1235");
}

TEST(LogFormat, BytesInTheLargestUnitAtLeastOne) {
  EXPECT_EQ(format_bytes(0), "0 bytes");
  EXPECT_EQ(format_bytes(1023), "1023 bytes");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(20.7e6), "19.74 MiB");
  EXPECT_EQ(format_bytes(3.0 * (1 << 30)), "3.00 GiB");
  EXPECT_EQ(format_bytes(43.0e12), "39.11 TiB");
  EXPECT_EQ(format_bytes(5.0 * 1024 * 1024 * 1024 * 1024 * 1024), "5.00 PiB");
  EXPECT_EQ(format_bytes(5.0 * 1024 * 1024 * 1024 * 1024 * 1024 * 1024), "5120.00 PiB");  // PiB is the largest unit
}

}  // namespace
}  // namespace aerie
