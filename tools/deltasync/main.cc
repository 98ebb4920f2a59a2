// deltasync: command-line front end. Exit codes: 0 success, 1 any error (one
// line on stderr), 2 usage error.
#include <unistd.h>

#include <csignal>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "children.h"
#include "cli_args.h"
#include "commands.h"
#include "deltasync/temp_file.h"

namespace {

// The path of this executable, for spawning replica processes.
std::string SelfExe(const char* argv0) {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, static_cast<size_t>(n));
  return argv0;
}

// The names of the visible subcommands, for "did you mean".
std::vector<std::string> CommandNames(CLI::App& app) {
  std::vector<std::string> names;
  for (CLI::App* sub : app.get_subcommands([](CLI::App* a) { return !a->get_group().empty(); })) {
    names.push_back(sub->get_name());
  }
  return names;
}

int UsageError(const std::string& message) {
  std::cerr << "deltasync: usage error: " << message << "\n(run 'deltasync help' or 'deltasync help COMMAND')\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace deltasync::cli;
  CLI::App app{"deltasync: ship only the bf16 weights that changed, from an RL trainer to its replicas"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deltasync 0.1.0");
  // Every --help shows each option's default ("[10]").
  app.option_defaults()->always_capture_default();
  auto formatter = std::make_shared<HelpFormatter>();
  formatter->column_width(32);  // a signature of up to 30 characters keeps two spaces before its text
  app.formatter(formatter);
  app.footer("Run 'deltasync help COMMAND' (or 'deltasync COMMAND --help') for a command's options and an example.\n"
             "Exit codes: 0 success, 1 error (one line on stderr), 2 usage error. Docs: docs/cli.md.");

  std::string help_topic;
  auto* help_cmd = app.add_subcommand("help", "Show the help of deltasync or of one command");
  help_cmd->add_option("command", help_topic, "The command to describe");
  help_cmd->footer("Example:\n  deltasync help publish");

  DiffArgs diff;
  auto* diff_cmd = app.add_subcommand("diff", "Write a delta from two safetensors files with the same tensors");
  diff_cmd->add_option("old", diff.old_path, "Base weights (bf16 or fp32; fp32 is rounded to bf16)")->required();
  diff_cmd->add_option("new", diff.new_path, "New weights (bf16 or fp32)")->required();
  diff_cmd->add_option("-o,--output", diff.out_path, "Patch file to write")->required();
  diff_cmd->add_option("--encoding", diff.encoding, "gap_delta (TRL, default), raw (TRL) or compact (deltasync; "
                                                    "applies only to this exact base)")
      ->check(OneOf({"compact", "gap_delta", "raw"}));
  diff_cmd->add_option("--version", diff.version, "model_version written into the patch")->check(WholeNumber(1));
  diff_cmd->add_option("--base-version", diff.base_version, "compact: the base's version (default: version - 1)");
  diff_cmd->add_option("--stream-version", diff.stream_version,
                       "compact: stream version 2 or 3 (default 3, or 2 for a delta of < 4096 changes where that "
                       "is smaller; replicas read both)")
      ->check(WholeNumber(2, 3));
  diff_cmd->add_option("--container", diff.container,
                       "compact: container 1 (one tensor per changed parameter) or 2 (all streams in one tensor; "
                       "default 2, or 1 where that is smaller; replicas read both)")
      ->check(WholeNumber(1, 2));
  diff_cmd->add_flag("--allow-nonfinite", diff.allow_nonfinite, "Pass NaN/Inf bit patterns through");
  diff_cmd->add_flag("--json", diff.json, "Print one JSON object (sizes and the delta's entropy) instead of the line");
  diff_cmd->footer("Example:\n  deltasync diff step-99.safetensors step-100.safetensors -o step-100.delta.safetensors "
                   "--version 100");

  ApplyArgs apply;
  auto* apply_cmd = app.add_subcommand("apply", "Apply anchors/deltas to a base file; writes OUT only on success");
  apply_cmd->add_option("base", apply.base_path, "Base safetensors file")->required();
  apply_cmd->add_option("patches", apply.patch_paths, "Patches, applied in order")->required();
  apply_cmd->add_option("-o,--output", apply.out_path, "Output safetensors file")->required();
  apply_cmd->footer(
      "Example:\n  deltasync apply step-99.safetensors step-100.delta.safetensors -o step-100.safetensors");

  InspectArgs inspect;
  auto* inspect_cmd = app.add_subcommand("inspect", "Describe a safetensors file or patch");
  inspect_cmd->add_option("file", inspect.path, "A safetensors file: a checkpoint, an anchor or a delta")->required();
  inspect_cmd->add_flag("--json", inspect.json, "One JSON object (keys in docs/cli.md)");
  inspect_cmd->add_option("--base", inspect.base_path,
                          "A compact delta's base weights (bf16 or fp32), to name its changed tensors: a compact "
                          "delta in one-tensor form (container 2) lists them by index; refused unless its state hash "
                          "is the delta's base");
  inspect_cmd->footer("Example:\n  deltasync inspect ./bucket/deltas/00000000000000000002.safetensors --json");

  PublishArgs publish;
  auto* publish_cmd = app.add_subcommand("publish", "Publish a full-state checkpoint as version V");
  publish_cmd->add_option("bucket", publish.bucket, "Bucket: a directory, file:// or s3://bucket/prefix URL")
      ->required();
  publish_cmd->add_flag("--create-bucket", publish.create_bucket, "Create a missing S3 bucket");
  publish_cmd->add_option("file", publish.file,
                          "Checkpoint (.safetensors, bf16 or fp32), or a Hugging Face model folder (its shards "
                          "and side files: config, tokenizer)")
      ->required();
  publish_cmd->add_option("--version", publish.version, "Version to publish")->required()->check(WholeNumber(1));
  publish_cmd->add_option("--anchor-interval", publish.anchor_interval,
                          "Anchor every N versions (default: the bucket's setting; 10 for a new bucket)")
      ->check(WholeNumber(1));
  publish_cmd->add_option("--encoding", publish.encoding,
                          "compact (deltasync replicas) or gap_delta / raw (TRL-readable objects) (default: the "
                          "bucket's setting; compact for a new bucket)")
      ->check(OneOf({"compact", "gap_delta", "raw"}));
  publish_cmd->add_option("--cumulative-every", publish.cumulative_interval,
                          "Also write a delta from the last anchor every K versions, 0: never (default: the "
                          "bucket's setting; 0 for a new bucket)")
      ->check(WholeNumber(0));
  publish_cmd->add_option("--anchor-max-fraction", publish.anchor_max_fraction,
                          "Adaptive anchors: a new anchor once the cumulative delta exceeds this fraction of the "
                          "last anchor, 0: off (default: the bucket's setting; 0 for a new bucket)")
      ->check(Number(0));
  publish_cmd->add_flag("--change-settings", publish.change_settings,
                        "Allow the four settings above to differ from the ones the bucket stores (the new ones are "
                        "stored)");
  publish_cmd->add_flag("--allow-version-jump", publish.allow_version_jump,
                        "Allow a version more than 1000000 past the newest one");
  publish_cmd->add_flag("--allow-nonfinite", publish.allow_nonfinite, "Pass NaN/Inf bit patterns through");
  publish_cmd->add_option("--parts", publish.parts,
                          "per-file: publish a sharded model folder as one part per weight file, encoded and "
                          "uploaded in parallel; one: one unparted version")
      ->check(OneOf({"one", "per-file"}));
  publish_cmd->add_option("--notify", publish.notify, "Replica daemon URL to wake after the commit (repeatable)");
  publish_cmd->add_option("--notify-token-file", publish.notify_token_file, "Bearer token for --notify");
  auto* publish_json = publish_cmd->add_flag("--json", publish.json, "Print one JSON object (keys in docs/cli.md)");
  publish_cmd->add_flag("-q,--quiet", publish.quiet, "Print nothing on success")->excludes(publish_json);
  publish_cmd->footer("Example:\n  deltasync publish ./bucket step-100.safetensors --version 100\n"
                      "  deltasync publish ./bucket ./checkpoint-100/ --version 100   # a model folder\n"
                      "  deltasync publish ./bucket ./checkpoint-100/ --version 100 --parts per-file\n"
                      "  deltasync publish s3://my-bucket/run1 step-100.safetensors --version 100 --json");

  PullArgs pull;
  std::optional<uint64_t> pull_version;
  auto* pull_cmd = app.add_subcommand("pull", "Rebuild a version from the bucket, verified, into a file or a model folder");
  pull_cmd->add_option("bucket", pull.bucket, "Bucket: a directory, file:// or s3://bucket/prefix URL")->required();
  auto* pull_out = pull_cmd->add_option("-o,--output", pull.out_path,
                                        "Safetensors file to write (a plain checkpoint, format pt)");
  auto* pull_hf = pull_cmd->add_option("--hf-dir", pull.hf_dir,
                                       "Model folder to write (weights with the published sharding, side files)");
  pull_out->excludes(pull_hf);
  pull_cmd->add_option("--version", pull_version, "Version to rebuild (default: the newest)")->check(WholeNumber(1));
  pull_cmd->add_option("--max-shard-size", pull.max_shard_size, "--hf-dir: re-shard, e.g. 5GB, 500MB, 2GiB")
      ->needs(pull_hf);
  pull_cmd->add_flag("--force", pull.force, "--hf-dir: replace an existing non-empty folder")->needs(pull_hf);
  auto* pull_json = pull_cmd->add_flag("--json", pull.json, "Print one JSON object (keys in docs/cli.md)");
  pull_cmd->add_flag("-q,--quiet", pull.quiet, "Print nothing on success")->excludes(pull_json);
  pull_cmd->footer("Example:\n  deltasync pull ./bucket -o latest.safetensors\n"
                   "  deltasync pull ./bucket --hf-dir ./model --version 100\n"
                   "  deltasync pull s3://my-bucket/run1 -o step-100.safetensors --version 100");

  FollowArgs follow;
  auto* follow_cmd = app.add_subcommand("follow", "");  // hidden: replica process of the demo
  follow_cmd->group("");
  follow_cmd->add_option("bucket", follow.bucket)->required();
  follow_cmd->add_option("--until", follow.until)->required();
  follow_cmd->add_option("--poll-ms", follow.poll_ms);
  follow_cmd->add_option("--timeout", follow.timeout_s);
  follow_cmd->add_option("--threads", follow.threads);

  GcArgs gc;
  auto* gc_cmd = app.add_subcommand("gc", "Clean up a bucket: prune old versions, remove stale temporary files, abort stale S3 uploads");
  gc_cmd->add_option("bucket", gc.bucket, "Bucket: a directory, file:// or s3://bucket/prefix URL")->required();
  gc_cmd->add_option("--keep-anchors", gc.keep_anchors,
                     "Keep the newest K anchors and every version after the oldest of them; remove the rest")
      ->check(WholeNumber(1));
  gc_cmd->add_flag("--dry-run", gc.dry_run, "Only report what --keep-anchors and --temp-older-than would remove");
  std::string anchor_check = "full";
  gc_cmd
      ->add_option("--anchor-check", anchor_check,
                   "Before pruning, check the oldest kept anchor: 'full' reads and hashes it (default; downloads "
                   "its size), 'size' only checks its objects are there with their listed sizes")
      ->check(CLI::IsMember({"full", "size"}))
      ->each([&gc](const std::string& v) { gc.anchor_check_size = v == "size"; });
  gc_cmd->add_option("--abort-uploads-older-than", gc.abort_uploads_older_than_h,
                     "S3: abort multipart uploads started more than this many hours ago")
      ->check(Number(0));
  gc_cmd->add_option("--temp-older-than", gc.temp_older_than_h,
                     "Local bucket: remove temporary files of killed writers last written more than this many "
                     "hours ago (never a live writer's of this host)")
      ->check(Number(0));
  auto* gc_json = gc_cmd->add_flag("--json", gc.json, "Print one JSON object (keys in docs/cli.md)");
  gc_cmd->add_flag("-q,--quiet", gc.quiet, "Print nothing on success")->excludes(gc_json);
  gc_cmd->footer("Example:\n  deltasync gc ./bucket --keep-anchors 2 --dry-run\n"
                 "  deltasync gc ./bucket --temp-older-than 0   # once every writer has stopped\n"
                 "  deltasync gc s3://my-bucket/run1 --abort-uploads-older-than 6");

  LogArgs log;
  auto* log_cmd = app.add_subcommand("log", "One line per version of a bucket: objects, sizes, changed %, time, encoding");
  log_cmd->alias("ls");
  log_cmd->add_option("bucket", log.bucket, "Bucket: a directory, file:// or s3://bucket/prefix URL")->required();
  log_cmd->add_flag("--json", log.json, "One JSON object (keys in docs/cli.md)");
  log_cmd->footer("Example:\n  deltasync log ./bucket\n  deltasync ls s3://my-bucket/run1 --json");

  VerifyArgs verify;
  auto* verify_cmd = app.add_subcommand("verify", "Check a bucket's objects and state hashes without writing anything");
  verify_cmd->add_option("bucket", verify.bucket, "Bucket: a directory, file:// or s3://bucket/prefix URL")->required();
  auto* verify_version = verify_cmd->add_option("--version", verify.version, "Check what this version needs (default: the newest)")
                             ->check(WholeNumber(1));
  verify_cmd->add_flag("--all", verify.all, "Check every version and every object")->excludes(verify_version);
  verify_cmd->add_flag("--json", verify.json, "One JSON object (keys in docs/cli.md)");
  verify_cmd->add_option("--threads", verify.threads, "Threads to decode and hash (0: all cores)")
      ->check(WholeNumber(0, 4096));
  verify_cmd->footer("Example:\n  deltasync verify ./bucket\n  deltasync verify s3://my-bucket/run1 --all --json");

  BenchArgs bench;
  auto* bench_cmd = app.add_subcommand("bench", "Measure detect+encode and apply against memcpy");
  bench_cmd->add_flag("--quick", bench.quick, "A smaller model, for CI smoke runs");
  bench_cmd->add_flag("--json", bench.json, "Print one JSON object on the last line");
  bench_cmd->add_option("--threads", bench.threads, "Threads for detect+encode and apply")->check(WholeNumber(1, 4096));
  bench_cmd->add_flag("--sweep", bench.sweep,
                      "Only the replica's compact apply, over model sizes (--scales) x change rates (--rates)");
  bench_cmd->add_option("--scales", bench.scales, "--sweep: model sizes as multiples of Qwen3-0.6B's shapes")
      ->check(CLI::Range(0.01, 8.0))
      ->delimiter(',');
  bench_cmd->add_option("--rates", bench.rates, "--sweep: fractions of elements changed per version")
      ->check(CLI::Range(0.0, 1.0))
      ->delimiter(',');
  bench_cmd->footer("Example:\n  deltasync bench --quick --json\n  deltasync bench --sweep --scales 0.25,1,2 --rates 0.005,0.03,0.1");

  DemoArgs demo;
  auto* demo_cmd = app.add_subcommand("demo", "Train a synthetic Qwen3-0.6B-shaped model; two replicas follow");
  demo_cmd->add_option("--bucket", demo.bucket,
                       "Bucket directory or s3://bucket/prefix; a rerun deletes only the demo's own objects");
  demo_cmd->add_flag("--force", demo.force,
                     "Use a non-empty bucket the demo did not create: delete deltasync's objects in it "
                     "(manifest.json, anchors/ deltas/ ds/ step_*.safetensors), keep every other file");
  demo_cmd->add_flag("--create-bucket", demo.create_bucket, "Create a missing S3 bucket");
  demo_cmd->add_option("--steps", demo.steps, "Versions to publish")->check(WholeNumber(1));
  demo_cmd->add_option("--lr", demo.lr, "AdamW learning rate")->check(Number(0, /*exclusive=*/true));
  demo_cmd->add_option("--layers", demo.layers, "Decoder layers (Qwen3-0.6B has 28)")->check(WholeNumber(1, 28));
  demo_cmd->add_option("--anchor-interval", demo.anchor_interval, "Anchor every N versions")->check(WholeNumber(1));
  demo_cmd->add_option("--seed", demo.seed, "Seed of the synthetic model and its updates")->check(WholeNumber(0));
  demo_cmd->add_option("--replicas", demo.replicas, "Replica processes")->check(WholeNumber(1, 8));
  demo_cmd->add_option("--encoding", demo.encoding, "compact, gap_delta or raw (as for publish)")
      ->check(OneOf({"compact", "gap_delta", "raw"}));
  demo_cmd->add_option("--cumulative-every", demo.cumulative_interval, "Cumulative delta every K versions (0: never)")
      ->check(WholeNumber(0));
  demo_cmd->add_flag("--serve", demo.serve, "Run the replicas as 'serve' daemons, woken by /notify");
  demo_cmd->footer("Example:\n  deltasync demo --layers 2 --steps 5");

  ServeArgs serve;
  auto* serve_cmd = app.add_subcommand("serve", "Replica daemon: follows the bucket, speaks TRL's control plane over HTTP");
  std::string serve_bucket_flag;
  serve_cmd->add_option("bucket", serve.bucket, "Bucket: a directory, file:// or s3://bucket/prefix URL");
  serve_cmd->add_option("--bucket", serve_bucket_flag, "The same as BUCKET (the older form)");
  serve_cmd->add_option("--listen", serve.listen, "HOST:PORT, [IPV6]:PORT or PORT (on 127.0.0.1) to bind; port 0: any "
                                                  "free port");
  auto* out_opt = serve_cmd->add_option("--out", serve.out_dir,
                                        "Write each version held to DIR as a model folder DIR/step_NNNNNN/ "
                                        "(DIR/latest links the newest)");
  serve_cmd->add_option("--keep", serve.keep, "--out versions kept (newest)")
      ->check(WholeNumber(1, 1000000))
      ->needs(out_opt);
  serve_cmd->add_option("--out-layout", serve.out_layout,
                        "folder: a model folder per version (default); file: one DIR/step_NNNNNN.safetensors")
      ->check(OneOf({"folder", "file"}))
      ->needs(out_opt);
  serve_cmd->add_option("--shm", serve.shm, "POSIX shared-memory object holding the state (docs/shm.md)");
  serve_cmd->add_option("--token-file", serve.token_file, "Bearer token required on POST routes");
  serve_cmd->add_option("--poll", serve.poll, "Seconds between manifest reads")->check(Number(0, /*exclusive=*/true));
  auto* cert_opt = serve_cmd->add_option("--tls-cert", serve.tls_cert, "PEM certificate: serve HTTPS");
  auto* key_opt = serve_cmd->add_option("--tls-key", serve.tls_key, "PEM private key for --tls-cert");
  cert_opt->needs(key_opt);
  key_opt->needs(cert_opt);
  serve_cmd->add_option("--threads", serve.threads, "Threads to apply versions (0: all cores)")
      ->check(WholeNumber(0, 4096));
  serve_cmd->add_option("--log-level", serve.log_level,
                        "Least level logged to stderr: debug, info, warn or error (default: $DELTASYNC_LOG_LEVEL, "
                        "else info)")
      ->check(OneOf({"debug", "info", "warn", "error"}));
  serve_cmd->footer("Example:\n  deltasync serve ./bucket --listen 8471 --out /dev/shm/weights\n"
                    "  deltasync serve s3://my-bucket/run1 --listen 0.0.0.0:8470 --token-file token.txt");

  // No command: the overview, as a usage error. A first word that is no
  // command: the nearest one.
  if (argc < 2) {
    std::cerr << app.help();
    return 2;
  }
  const std::vector<std::string> commands = CommandNames(app);
  const std::string first = argv[1];
  const std::vector<CLI::App*> all = app.get_subcommands([](CLI::App*) { return true; });
  bool known = std::any_of(all.begin(), all.end(), [&](CLI::App* a) { return a->check_name(first); });  // aliases too
  if (!first.starts_with("-") && !known) {
    std::string near = ClosestMatch(first, commands);
    return UsageError("unknown command '" + first + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)"));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return UsageError(UsageMessage(e));
  }
  if (*help_cmd) {
    if (help_topic.empty()) {
      // app.help() would describe the selected subcommand, 'help' itself.
      std::cout << app.get_formatter()->make_help(&app, "deltasync", CLI::AppFormatMode::Normal);
      return 0;
    }
    CLI::App* topic = nullptr;
    try {
      topic = app.get_subcommand(help_topic);
    } catch (const CLI::OptionNotFound&) {
    }
    if (topic == nullptr || topic->get_group().empty()) {
      std::string near = ClosestMatch(help_topic, commands);
      return UsageError("unknown command '" + help_topic + "'" +
                        (near.empty() ? "" : " (did you mean '" + near + "'?)"));
    }
    std::cout << topic->help();
    return 0;
  }
  if (*serve_cmd) {
    // One bucket convention: BUCKET like every command; --bucket still works.
    if (!serve_bucket_flag.empty() && !serve.bucket.empty() && serve_bucket_flag != serve.bucket) {
      return UsageError("serve: the bucket is given twice and differs ('" + serve.bucket + "' and --bucket '" +
                        serve_bucket_flag + "'); give it once");
    }
    if (serve.bucket.empty()) serve.bucket = serve_bucket_flag;
    if (serve.bucket.empty()) return UsageError("serve: BUCKET is required (e.g. deltasync serve ./bucket)");
  }
  if (pull_version) pull.version = *pull_version;
  if (*pull_cmd && pull.out_path.empty() && pull.hf_dir.empty()) {
    return UsageError("pull needs -o FILE or --hf-dir DIR");
  }

  // Signals: `serve` stops cleanly by itself (cmd_serve.cc); the demo stops
  // its children and exits 130/143; every other command removes its
  // temporary files and dies by the signal. A child of the demo dies with it.
  DieWithParentIfAsked();
  // A file-size limit (`ulimit -f`) reached by a write: the write fails with
  // EFBIG and the command says so and removes its temporary file, instead of
  // dying by SIGXFSZ with the temporary left beside OUT.
  ::signal(SIGXFSZ, SIG_IGN);
  if (*demo_cmd) {
    InstallDemoInterruptHandlers();
  } else if (!*serve_cmd) {
    deltasync::InstallTempFileCleanupOnSignals();
  }

  deltasync::Status status;
  try {
    if (*diff_cmd) status = RunDiff(diff);
    else if (*apply_cmd) status = RunApply(apply);
    else if (*inspect_cmd) status = RunInspect(inspect);
    else if (*publish_cmd) status = RunPublish(publish);
    else if (*pull_cmd) status = RunPull(pull);
    else if (*follow_cmd) status = RunFollow(follow);
    else if (*gc_cmd) status = RunGc(gc);
    else if (*log_cmd) status = RunLog(log);
    else if (*verify_cmd) status = RunVerify(verify);
    else if (*bench_cmd) status = RunBench(bench);
    else if (*demo_cmd) status = RunDemo(demo, SelfExe(argv[0]));
    else if (*serve_cmd) status = RunServe(serve);
  } catch (const std::exception& e) {  // e.g. std::bad_alloc
    status = deltasync::Status::Internal(e.what());
  }
  if (!status.ok()) {
    std::cout.flush();
    std::fprintf(stderr, "deltasync: error: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
