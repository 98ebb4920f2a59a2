// serve: the replica daemon's process. The library does the work
// (deltasync::Server); this file turns flags into ServerOptions, logs events
// to stderr and waits for SIGTERM/SIGINT. The signals are blocked before any
// thread starts, so every thread inherits the mask and only sigwait() here
// sees them: a clean stop, never a handler running on some random thread.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "deltasync/server.h"

namespace deltasync::cli {

Result<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError(path + ": cannot read the token file: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  size_t begin = token.find_first_not_of(" \t\r\n");
  size_t end = token.find_last_not_of(" \t\r\n");
  token = begin == std::string::npos ? "" : token.substr(begin, end - begin + 1);
  if (token.empty()) return Status::InvalidArgument(path + ": the token file is empty");
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      // Never echo the token itself.
      return Status::InvalidArgument(path + ": the token must be one line of printable ASCII without spaces");
    }
  }
  if (token.size() > 4096) return Status::InvalidArgument(path + ": the token is longer than 4096 characters");
  return token;
}

namespace {

constexpr const char* kLevelNames[] = {"debug", "info", "warn", "error"};

Result<LogLevel> ParseLogLevel(const std::string& text, const std::string& source) {
  for (int i = 0; i < 4; ++i) {
    if (text == kLevelNames[i]) return static_cast<LogLevel>(i);
  }
  return Status::InvalidArgument(source + " must be debug, info, warn or error, not '" + text + "'");
}

// "2026-11-30T17:02:03.123Z": now, ISO 8601 in UTC with milliseconds.
std::string UtcTimestamp() {
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char buf[40];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms % 1000));
  return buf;
}

// One line on stderr: "<time> <level> deltasync serve: <text>".
void LogLine(LogLevel level, std::string_view text) {
  std::fprintf(stderr, "%s %s deltasync serve: %.*s\n", UtcTimestamp().c_str(),
               kLevelNames[static_cast<int>(level)], static_cast<int>(text.size()), text.data());
}

}  // namespace

Status RunServe(const ServeArgs& args) {
  LogLevel least = LogLevel::kInfo;
  if (!args.log_level.empty()) {
    DS_ASSIGN_OR_RETURN(least, ParseLogLevel(args.log_level, "--log-level"));
  } else if (const char* env = std::getenv("DELTASYNC_LOG_LEVEL"); env != nullptr && *env != '\0') {
    DS_ASSIGN_OR_RETURN(least, ParseLogLevel(env, "DELTASYNC_LOG_LEVEL"));
  }
  ServerOptions options;
  options.bucket = args.bucket;
  options.listen = args.listen;
  options.out_dir = args.out_dir;
  options.keep = args.keep;
  options.out_layout = args.out_layout == "file" ? OutLayout::kFile : OutLayout::kFolder;
  options.shm_name = args.shm;
  options.poll_seconds = args.poll;
  options.tls_cert = args.tls_cert;
  options.tls_key = args.tls_key;
  options.threads = args.threads;
  if (!args.token_file.empty()) {
    DS_ASSIGN_OR_RETURN(options.token, ReadTokenFile(args.token_file));
  }
  options.log = [least](LogLevel level, std::string_view line) {
    if (level >= least) LogLine(level, line);
  };

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);
  // A client that hangs up mid-response (TLS writes) must not kill the daemon.
  ::signal(SIGPIPE, SIG_IGN);

  Result<std::unique_ptr<Server>> server = Server::Start(std::move(options));
  if (!server.ok()) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return server.status();
  }
  std::printf("listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  if (LogLevel::kInfo >= least) LogLine(LogLevel::kInfo, std::string(strsignal(signal_number)) + ": stopping");
  (*server)->Stop();
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return Status::OK();
}

}  // namespace deltasync::cli
