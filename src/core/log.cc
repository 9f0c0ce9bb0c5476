#include "core/log.h"

#include <boost/log/attributes/mutable_constant.hpp>
#include <boost/log/core.hpp>
#include <boost/log/expressions.hpp>
#include <boost/log/support/date_time.hpp>
#include <boost/log/utility/setup/common_attributes.hpp>
#include <boost/log/utility/setup/console.hpp>
#include <cstdio>
#include <iostream>

#include "core/error.h"

namespace aerie {

namespace {
int g_rank = 0;
bool g_sink = false;
}  // namespace

int log_rank() { return g_rank; }

void init_logging(int rank, const std::string& min_level) {
  namespace logging = boost::log;
  namespace expr = boost::log::expressions;
  g_rank = rank;
  logging::trivial::severity_level level;
  AERIE_CHECK(logging::trivial::from_string(min_level.c_str(), min_level.size(), level),
              "unknown log level '" << min_level << "' (trace, debug, info, warning, error)");
  auto core = logging::core::get();
  // A mutable constant: a second call (tests) changes the rank without re-adding the attribute.
  static logging::attributes::mutable_constant<int> rank_attr(rank);
  rank_attr.set(rank);
  if (!g_sink) core->add_global_attribute("Rank", rank_attr);
  if (!g_sink) {
    logging::add_common_attributes();
    logging::add_console_log(
        std::clog, logging::keywords::auto_flush = true,
        logging::keywords::format =
            (expr::stream << expr::format_date_time<boost::posix_time::ptime>("TimeStamp", "%H:%M:%S")
                          << " [r" << expr::attr<int>("Rank") << "] " << logging::trivial::severity
                          << " " << expr::smessage));
    g_sink = true;
  }
  core->set_filter(logging::trivial::severity >= level);
}

std::string format_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string format_bytes(double bytes) {
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (!(bytes >= 1024)) return format_fixed(bytes, 0) + " bytes";
  int u = 0;
  bytes /= 1024;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return format_fixed(bytes, 2) + " " + units[u];
}

}  // namespace aerie
