#include "core/log.h"

#include <boost/log/attributes/mutable_constant.hpp>
#include <boost/log/core.hpp>
#include <boost/log/expressions.hpp>
#include <boost/log/support/date_time.hpp>
#include <boost/log/utility/setup/common_attributes.hpp>
#include <boost/log/utility/setup/console.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "core/error.h"

namespace aerie {

namespace {
int g_rank = 0;
bool g_sink = false;
int g_level = boost::log::trivial::info;  // the threshold init_logging or a ScopedLogLevel set

boost::log::trivial::severity_level parse_level(const std::string& name) {
  boost::log::trivial::severity_level level;
  AERIE_CHECK(boost::log::trivial::from_string(name.c_str(), name.size(), level),
              "unknown log level '" << name << "' (trace, debug, info, warning, error)");
  return level;
}

void set_threshold(int level) {
  g_level = level;
  boost::log::core::get()->set_filter(boost::log::trivial::severity >=
                                      static_cast<boost::log::trivial::severity_level>(level));
}
}  // namespace

int log_rank() { return g_rank; }

ScopedLogLevel::ScopedLogLevel(const std::string& min_level) : previous_(g_level) {
  set_threshold(std::max(g_level, static_cast<int>(parse_level(min_level))));
}

ScopedLogLevel::~ScopedLogLevel() { set_threshold(previous_); }

void init_logging(int rank, const std::string& min_level) {
  namespace logging = boost::log;
  namespace expr = boost::log::expressions;
  g_rank = rank;
  const logging::trivial::severity_level level = parse_level(min_level);
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
  set_threshold(level);
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
