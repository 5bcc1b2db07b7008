#include "git/git.hpp"

#include <fcntl.h>
#include <signal.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <chrono>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "base/strings.hpp"
#include "sys/fs.hpp"

namespace cordon::git {
namespace {

using std::chrono::milliseconds;

constexpr const char* kEllipsis = "\xE2\x80\xA6";  // "…"
// Slack over the git timeout for the engine to settle the job (kill grace, banking).
constexpr milliseconds kSettleSlack{5000};
// How much of git's stderr a failed ref resolution quotes (the job keeps all of it).
constexpr uint64_t kResolveErrorChars = 300;
constexpr milliseconds kWaitSlice{200};
constexpr milliseconds kSettleAfterKill{2000};

// A string as a JSON-ish literal for refusals: quotes and backslashes escaped, control
// characters shown as \xNN, so a hostile value cannot forge the rest of the message.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

Result<void> check_plain_value(const std::string& field, const std::string& value) {
  if (value.empty()) {
    return refusal("{} is empty; pass a value or leave it out", field);
  }
  if (value.size() > kMaxValueChars) {
    return refusal("{} is longer than {} characters", field, kMaxValueChars);
  }
  // Values, never flags: git would read a leading "-" as an option (--output=FILE writes).
  if (value[0] == '-') {
    return refusal("{} {} must not start with \"-\": pass a value, never an option", field,
                   quoted(value));
  }
  for (unsigned char c : value) {
    if (c < 0x20 || c == 0x7f) {
      return refusal("{} {} contains a control character", field, quoted(value));
    }
  }
  return {};
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
}

// YYYY-MM-DD, optionally followed by [T ]hh:mm[:ss] and Z or ±hh:mm.
bool is_iso_date(std::string_view s) {
  auto digits_at = [&](size_t pos, size_t n) {
    return pos + n <= s.size() && all_digits(s.substr(pos, n));
  };
  if (!(digits_at(0, 4) && s.size() >= 10 && s[4] == '-' && digits_at(5, 2) && s[7] == '-' &&
        digits_at(8, 2))) {
    return false;
  }
  size_t i = 10;
  if (i == s.size()) {
    return true;
  }
  if (s[i] != 'T' && s[i] != ' ') {
    return false;
  }
  ++i;
  if (!(digits_at(i, 2) && i + 2 < s.size() && s[i + 2] == ':' && digits_at(i + 3, 2))) {
    return false;
  }
  i += 5;
  if (i < s.size() && s[i] == ':') {
    if (!digits_at(i + 1, 2)) {
      return false;
    }
    i += 3;
  }
  if (i == s.size()) {
    return true;
  }
  if (s[i] == 'Z') {
    return i + 1 == s.size();
  }
  if (s[i] == '+' || s[i] == '-') {
    return i + 6 == s.size() && digits_at(i + 1, 2) && s[i + 3] == ':' && digits_at(i + 4, 2);
  }
  return false;
}

bool is_relative_date(std::string_view s) {
  auto words = split(s, ' ');
  if (words.size() != 3 || !all_digits(words[0]) || words[0].size() > 5 || words[2] != "ago") {
    return false;
  }
  static const char* const kUnits[] = {"day",   "days",   "week", "weeks",
                                       "month", "months", "year", "years"};
  return std::any_of(std::begin(kUnits), std::end(kUnits),
                     [&](const char* u) { return words[1] == u; });
}

// Reads a small file beneath `dirfd` (no symlink may lead out of it).
Result<std::string> read_beneath(int dirfd, const std::string& rel) {
  CORDON_TRY(fd, sys::openat2_fd(dirfd, rel, O_RDONLY | O_NOCTTY | O_NONBLOCK,
                                 RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS));
  CORDON_TRY(st, sys::fstat_fd(fd.get()));
  if (!S_ISREG(st.st_mode)) {
    return refusal("`{}` in the repository is not a regular file", rel);
  }
  std::string out;
  char buf[4096];
  while (out.size() < 65536) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return sys_error("read `{}`", rel);
    }
    if (n == 0) {
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) {
    s.pop_back();
  }
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) {
    ++i;
  }
  return s.substr(i);
}

// `target` as git takes a path a file of the git directory names: absolute, or relative to
// `base` (an absolute directory). Not normalised.
std::string joined(const std::string& base, const std::string& target) {
  return !target.empty() && target[0] == '/' ? target : base + "/" + target;
}

// joined(base, target) normalised; empty when it leaves `root`.
std::string inside_root(const std::string& root, const std::string& base,
                        const std::string& target) {
  std::string abs = normalize_path(joined(base, target));
  return path_within(abs, root) ? abs : std::string();
}

std::string relative_to(const std::string& root, const std::string& abs) {
  return abs.size() == root.size() ? "." : abs.substr(root.size() + (root == "/" ? 0 : 1));
}

// A path the textual checks put inside the root must also resolve inside it: a symlink on the
// way (`gitdir: inner` with inner -> /elsewhere, an objects -> /elsewhere link, `l/..` with l a
// link to the root) would lead out. Missing is fine (git reports that itself); out is a refusal.
std::unexpected<Error> leads_outside(const GitSettings& s, const std::string& path,
                                     const char* what) {
  return refusal(
      "the repository's {} `{}` leads outside the repository root `{}` through a symbolic "
      "link; only repoRoot is visible to the git tools: set git.repoRoot to the checkout "
      "that holds the objects",
      what, path, s.repo_root);
}

// Where `target` (absolute, or relative to `base`, a resolved directory) leads, resolved as
// git's realpath resolves it (each symlink before the `..` after it), never by its text:
// the resolved path when it is inside the root, nullopt when it does not exist, a refusal
// when it leads outside. The checks give clear refusals; the git sandbox, which mounts only
// repoRoot, is the boundary (a link changed after the check leads nowhere).
// Resolved beneath the root's fd: what a link out leads to is never looked at, so a link
// into a dead mount cannot hold the call, and the answer is the same whether the place out
// there exists or not (a red-team review, session 40: it said which).
Result<std::optional<std::string>> resolve_inside(const GitSettings& s, int rootfd,
                                                  const std::string& base,
                                                  const std::string& target, const char* what) {
  const std::string path = joined(base, target);
  auto fd = sys::open_within(rootfd, s.resolved_root, path, 0);
  if (!fd) {
    int err = fd.error().sys_errno();
    if (err == ENOENT || err == ENOTDIR) {
      return std::nullopt;
    }
    if (err == EXDEV) {
      return leads_outside(s, path, what);
    }
    return std::unexpected(std::move(fd.error()).wrap("check the repository's {}", what));
  }
  CORDON_TRY(real, sys::fd_path(fd->get()));
  if (!path_within(real, s.resolved_root)) {
    return leads_outside(s, path, what);
  }
  return real;
}

// A file of the git directory that names other paths (commondir, objects/info/alternates),
// read beneath the root: nullopt when there is none. One that leads outside through a symlink
// is refused, and one that exists but cannot be read is an error, not "none": git might still
// follow it where cordon could not look.
Result<std::optional<std::string>> read_link_file(const GitSettings& s, int rootfd,
                                                  const std::string& abs, const char* what) {
  auto text = read_beneath(rootfd, relative_to(s.resolved_root, abs));
  if (text) {
    return std::move(*text);
  }
  if (text.error().sys_errno() == ENOENT) {
    return std::nullopt;
  }
  if (text.error().sys_errno() == EXDEV) {
    return leads_outside(s, abs, what);
  }
  return std::unexpected(std::move(text.error()).wrap("read the repository's {}", what));
}

// `text` without the line ends git strips from a path file's end (commondir, a gitdir file):
// only trailing CR and LF, nothing else, as git reads them.
std::string without_line_end(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) {
    text.pop_back();
  }
  return text;
}

// The object directories `objects` (resolved) borrows from (objects/info/alternates, each entry
// relative to `objects` or absolute), and theirs in turn, as deep as git follows them (5
// levels), must stay inside the root by their text and where they resolve. The file is parsed
// as git parses it: one entry a line, taken whole (no trimming), `#` only as a line's first
// byte; a C-quoted entry (git unquotes it) is refused.
// Each object directory is read once (git skips one it has, too), and at most
// kMaxAlternateEntries entries are followed in all: without either, `.` written N times
// cost N^5 lookups on the host, outside any job and its timeout (N = 15 took 84 s of cordon's
// CPU: a red-team review, session 40).
struct AlternatesWalk {
  std::set<std::string> seen;
  size_t entries = 0;
};
constexpr size_t kMaxAlternateEntries = 256;

Result<void> check_alternates(const GitSettings& s, int rootfd, const std::string& objects,
                              int depth, AlternatesWalk& walk) {
  constexpr int kMaxAlternateDepth = 5;  // git's own limit (object-file.c, link_alt_odb_entry)
  if (!walk.seen.insert(objects).second) {
    return {};
  }
  CORDON_TRY(alternates,
             read_link_file(s, rootfd, objects + "/info/alternates", "alternates file"));
  if (!alternates) {
    return {};
  }
  for (const auto& entry : split(*alternates, '\n')) {
    if (entry.empty() || entry[0] == '#') {
      continue;
    }
    if (++walk.entries > kMaxAlternateEntries) {
      return refusal(
          "the repository's objects/info/alternates files name more than {} object directories "
          "(from `{}`), more than the git tools follow; repack the repository (`git repack -a "
          "-d`, then remove objects/info/alternates)",
          kMaxAlternateEntries, objects);
    }
    if (entry[0] == '"') {
      return refusal(
          "the repository's objects/info/alternates in `{}` has a quoted entry {}, which the git "
          "tools do not follow; repack the repository (`git repack -a -d`, then remove "
          "objects/info/alternates)",
          objects, quoted(entry));
    }
    if (inside_root(s.resolved_root, objects, entry).empty()) {
      return refusal(
          "the repository borrows objects from {} (objects/info/alternates of `{}`), outside the "
          "repository root `{}`; only repoRoot is visible to the git tools: repack the "
          "repository (`git repack -a -d`, then remove objects/info/alternates) or set "
          "git.repoRoot to include it",
          quoted(entry), objects, s.repo_root);
    }
    CORDON_TRY(real, resolve_inside(s, rootfd, objects, entry, "alternate object directory"));
    if (real && depth < kMaxAlternateDepth) {
      CORDON_CHECK(check_alternates(s, rootfd, *real, depth + 1, walk));
    }
  }
  return {};
}

// The git directory `git_dir` (as named: it may be a link), its commondir and its alternates
// must stay inside the root. A missing one is git's to report.
Result<void> check_git_dir_links(const GitSettings& s, int rootfd, const std::string& git_dir) {
  CORDON_TRY(resolved, resolve_inside(s, rootfd, s.resolved_root, git_dir, "git directory"));
  if (!resolved) {
    return {};
  }
  std::optional<std::string> common = *resolved;
  CORDON_TRY(text, read_link_file(s, rootfd, *resolved + "/commondir", "commondir file"));
  if (text) {
    std::string target = without_line_end(*text);
    if (inside_root(s.resolved_root, *resolved, target).empty()) {
      return refusal(
          "the repository's git directory `{}` names a common directory {} outside the "
          "repository root `{}`; only repoRoot is visible to the git tools: set git.repoRoot "
          "to the main checkout",
          git_dir, quoted(target), s.repo_root);
    }
    CORDON_TRY(common_dir, resolve_inside(s, rootfd, *resolved, target, "common git directory"));
    common = std::move(common_dir);
  }
  if (common) {
    CORDON_TRY(objects, resolve_inside(s, rootfd, *common, "objects", "object directory"));
    if (objects) {
      AlternatesWalk walk;
      CORDON_CHECK(check_alternates(s, rootfd, *objects, 0, walk));
    }
  }
  return {};
}

std::string join_command(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) {
      out += ' ';
    }
    bool plain = !a.empty() && std::all_of(a.begin(), a.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_=./:,@^{}~+%", c);
    });
    out += plain ? a : quoted(a);
  }
  return out;
}

// The first `limit` chars of a stream, "…" appended when there is more.
Result<std::string> preview_of(Engine& engine, const std::string& session, const std::string& id,
                               const std::string& stream, uint64_t limit) {
  CORDON_TRY(page, engine.output(session, id, {.stream = stream, .offset = 0, .limit = limit}));
  std::string out = std::move(page.content);
  if (page.has_more) {
    out += kEllipsis;
  }
  return out;
}

}  // namespace

const std::vector<std::string>& hardened_prefix() {
  // Measured on git 2.39 with a hostile repository (tests/security/git_test.cpp): each of
  // these closes a path by which the repository's config made a read-only command run a
  // program. `-c` on the command line outranks every config file, included ones too.
  static const char* const kConfig[] = {
      "color.ui=false",
      "diff.external=",            // an external diff program (tree-to-tree diffs too)
      "core.fsmonitor=false",      // the fsmonitor hook runs on every index read
      "core.hooksPath=/dev/null",  // hooks (post-index-change runs on an index refresh)
      "log.showSignature=false",   // with gpg.program: ran on git log and git show
      "gpg.program=/bin/false",    // and every signature program, should one be asked
      "gpg.openpgp.program=/bin/false",
      "gpg.ssh.program=/bin/false",
      "gpg.x509.program=/bin/false",
      // No transport (ext:: runs commands; a promisor's lazy fetch): a repository's own
      // protocol.<name>.allow outranks this, so GIT_ALLOW_PROTOCOL (the git policy's env) is
      // the wall, with GIT_NO_LAZY_FETCH; this only covers an env that lost them.
      "protocol.allow=never",
      "core.sshCommand=/bin/false",
      "core.askPass=/bin/false",
      "credential.helper=",
      "core.alternateRefsCommand=/bin/false",
      // diff.submodule=diff makes diff and show run `git diff` inside a changed submodule, a
      // child that reads the submodule's own config and attributes (a diff driver command,
      // textconv) without --no-ext-diff/--no-textconv; `short` prints the two commit ids.
      "diff.submodule=short",
      // The repository may be owned by another uid (as the sandbox sees it): git would refuse
      // it as "dubious ownership". The sandbox, not ownership, is what contains it here.
      "safe.directory=*",
  };
  static const std::vector<std::string> kPrefix = [] {
    std::vector<std::string> p = {
        "--no-pager",            // core.pager / pager.<cmd>
        "--literal-pathspecs",   // no :(exclude), :/ or glob magic in paths
        "--no-replace-objects",  // refs/replace cannot swap what a commit id shows
    };
    for (const char* c : kConfig) {
      p.push_back("-c");
      p.push_back(c);
    }
    return p;
  }();
  return kPrefix;
}

Error not_enabled() {
  return Error::refused(
      "the git tools are not enabled: add \"git\": {\"repoRoot\": \"/path/to/checkout\"} to "
      "the policy file (optionally binary, timeoutMs, maxOutputBytes, previewChars; see "
      "docs/git.md) and restart cordon");
}

Result<void> check_ref(const std::string& field, const std::string& ref) {
  CORDON_CHECK(check_plain_value(field, ref));
  for (unsigned char c : ref) {
    if (std::isspace(c)) {
      return refusal("{} {} is not a valid git revision (it contains whitespace)", field,
                     quoted(ref));
    }
  }
  return {};
}

Result<std::string> check_path(const GitSettings& s, const std::string& field,
                               const std::string& path) {
  CORDON_CHECK(check_plain_value(field, path));
  if (path[0] == ':') {
    return refusal(
        "{} {} looks like pathspec magic (:(exclude), :/, :(glob)…), which the git tools do "
        "not take; pass a plain path relative to the repository root",
        field, quoted(path));
  }
  std::string abs;
  if (path[0] == '/') {
    abs = normalize_path(path);
  } else {
    abs = normalize_path(s.repo_root + "/" + path);
  }
  // Both spellings of the root count: as written in the policy and as the kernel resolved it.
  for (const std::string* root : {&s.repo_root, &s.resolved_root}) {
    if (path_within(abs, *root)) {
      return relative_to(*root, abs);
    }
  }
  return refusal(
      "{} {} is outside the repository root `{}`; pass a path inside it (a relative path is "
      "taken from the repository root)",
      field, quoted(path), s.repo_root);
}

Result<void> check_since(const std::string& since) {
  CORDON_CHECK(check_plain_value("since", since));
  if (is_iso_date(since) || is_relative_date(since)) {
    return {};
  }
  return refusal(
      "since {} is not a date: pass an ISO date (\"2024-05-01\" or \"2024-05-01T12:00:00Z\") "
      "or \"N days ago\" (days, weeks, months or years)",
      quoted(since));
}

Result<std::string> git_dir_for(const GitSettings& s) {
  CORDON_TRY_CTX(rootfd,
                 sys::openat2_fd(AT_FDCWD, s.resolved_root, O_PATH | O_DIRECTORY,
                                 RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS),
                 "open the repository root `{}`", s.repo_root);
  auto dotgit = sys::openat2_fd(rootfd.get(), ".git", O_PATH,
                                RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
  if (!dotgit) {
    int err = dotgit.error().sys_errno();
    if (err == ELOOP) {
      return refusal(
          "`.git` in the repository root `{}` is a symlink; the git tools read only a .git "
          "directory (or a .git file pointing inside the root)",
          s.repo_root);
    }
    if (err != ENOENT) {
      return std::unexpected(std::move(dotgit.error()).wrap("open `{}/.git`", s.repo_root));
    }
    // A bare repository: repoRoot is the git directory.
    auto head = sys::openat2_fd(rootfd.get(), "HEAD", O_PATH, RESOLVE_BENEATH);
    auto objects = sys::openat2_fd(rootfd.get(), "objects", O_PATH | O_DIRECTORY, RESOLVE_BENEATH);
    if (head && objects) {
      CORDON_CHECK(check_git_dir_links(s, rootfd.get(), s.resolved_root));
      return s.resolved_root;
    }
    return refusal(
        "there is no git repository at the repository root `{}` (no .git); set git.repoRoot "
        "in the policy to a checkout",
        s.repo_root);
  }
  CORDON_TRY(st, sys::fstat_fd(dotgit->get()));
  std::string git_dir = s.resolved_root + "/.git";
  if (S_ISREG(st.st_mode)) {
    // A worktree or submodule: "gitdir: <path>". Only a target inside the root is visible
    // in the sandbox; a hostile one could point at another repository on the host.
    // Read as git reads it: "gitdir: " and the rest of the file, less its trailing line ends.
    CORDON_TRY(text, read_beneath(rootfd.get(), ".git"));
    if (text.rfind("gitdir: ", 0) != 0) {
      return refusal("`{}/.git` is a file but not a gitdir link", s.repo_root);
    }
    std::string target = without_line_end(text.substr(8));
    git_dir = joined(s.resolved_root, target);
    if (inside_root(s.resolved_root, s.resolved_root, target).empty()) {
      return refusal(
          "`{}/.git` is a file pointing to {}, outside the repository root; only repoRoot is "
          "visible to the git tools: set git.repoRoot to the main checkout (the one whose "
          ".git directory holds the objects)",
          s.repo_root, quoted(target));
    }
  } else if (!S_ISDIR(st.st_mode)) {
    return refusal("`{}/.git` is neither a directory nor a gitdir file", s.repo_root);
  }
  CORDON_CHECK(check_git_dir_links(s, rootfd.get(), git_dir));
  return git_dir;
}

// ---- Runner -----------------------------------------------------------------------------------

Runner::Runner(Engine& engine, std::string session, GitSettings settings,
               std::function<bool()> cancelled)
    : engine_(engine),
      session_(std::move(session)),
      settings_(std::move(settings)),
      cancelled_(std::move(cancelled)) {}

// A git job given up on: killed, and read once it settles (a bounded wait), so that it does
// not count in the agent's `finished`, like every git job.
void Runner::kill_and_read(const std::string& task_id) {
  (void)engine_.kill(session_, task_id, SIGKILL);
  (void)engine_.status(session_, task_id, kSettleAfterKill);
}

Result<JobStatus> Runner::run_job(const std::vector<std::string>& args) {
  if (git_dir_.empty()) {
    CORDON_TRY(dir, git_dir_for(settings_));
    git_dir_ = std::move(dir);
  }
  StartOptions o;
  o.policy = JobPolicy::kGit;
  o.argv.push_back(settings_.binary);
  const auto& prefix = hardened_prefix();
  o.argv.insert(o.argv.end(), prefix.begin(), prefix.end());
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env["GIT_DIR"] = git_dir_;
  o.label = "git " + (args.empty() ? std::string() : args[0]);
  CORDON_TRY(started, engine_.start(session_, o));
  JobStatus st = std::move(started);
  auto deadline =
      std::chrono::steady_clock::now() + milliseconds(settings_.timeout_ms) + kSettleSlack;
  while (!st.settled()) {
    if (cancelled_ && cancelled_()) {
      kill_and_read(st.task_id);
      return refusal("the git call was cancelled (job {} killed)", st.task_id);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      kill_and_read(st.task_id);
      if (st.state == "queued") {
        // It never had a slot: the caller's to know and wait for, not cordon's failure (it was
        // `internal` "did not settle" before session 29).
        return refusal(
            "the git call waited {} ms and never started (job {}): the engine's "
            "concurrency.total is taken, or this session's git calls already running ({} at "
            "once) are, or this uid's ({} at once where concurrency.perUid is set); call again "
            "once running calls end",
            settings_.timeout_ms + kSettleSlack.count(), st.task_id, kGitJobsPerSession,
            kGitJobsPerOwner);
      }
      return std::unexpected(
          Error(ErrorCode::kInternal, 0,
                fmt::format("git job {} did not settle within its timeout", st.task_id)));
    }
    CORDON_TRY(next, engine_.status(session_, st.task_id, kWaitSlice));
    st = std::move(next);
  }
  // Reading it marks it read: the `finished` counter belongs to the agent's own commands.
  CORDON_TRY(final_status, engine_.status(session_, st.task_id));
  return final_status;
}

Result<std::string> Runner::resolve(const std::string& field, const std::string& ref) {
  CORDON_CHECK(check_ref(field, ref));
  // `:/text` names the youngest commit whose message matches: a commit already, and a suffix
  // would become part of the text.
  const std::string commit = ref.starts_with(":/") ? ref : ref + "^{commit}";
  CORDON_TRY(st, run_job({"rev-parse", "--verify", "--quiet", "--end-of-options", commit}));
  if (st.state != "exited") {
    // A missing or refused git binary settles as `failed` with the reason.
    return refusal("could not resolve {} {}: git did not run to the end ({}{}{})", field,
                   quoted(ref), st.state, st.error.empty() ? "" : ": ", st.error);
  }
  CORDON_TRY(out, engine_.output(session_, st.task_id, {.stream = "stdout", .limit = 200}));
  std::string oid = trim(out.content);
  bool hex =
      (oid.size() == 40 || oid.size() == 64) && std::all_of(oid.begin(), oid.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
      });
  if (st.exit_code.value_or(-1) != 0 || !hex) {
    // --quiet: a name that is no commit says nothing; what git does say (a broken config, a
    // corrupt packed-refs) is why it could not answer.
    CORDON_TRY(err, engine_.output(session_, st.task_id,
                                   {.stream = "stderr", .limit = kResolveErrorChars}));
    std::string said = trim(err.content);
    if (!said.empty()) {
      if (err.has_more) {
        said += kEllipsis;
      }
      return refusal(
          "could not resolve {} {}: git said {} (job {}; read its stderr with command_output "
          "for all of it)",
          field, quoted(ref), quoted(said), st.task_id);
    }
    return refusal(
        "{} {} is not a valid git revision (no commit by that name in the repository); pass "
        "a branch, tag, commit id or an expression such as HEAD~1",
        field, quoted(ref));
  }
  return oid;
}

Result<GitResult> Runner::run(const std::vector<std::string>& args) {
  CORDON_TRY(st, run_job(args));
  GitResult r;
  r.task_id = st.task_id;
  r.command = join_command(st.argv);
  r.state = st.state;
  r.exit_code = st.exit_code;
  r.ok = st.state == "exited" && st.exit_code.value_or(-1) == 0;
  r.message = st.error;
  r.output = st.stdout_artifact;
  if (st.state != "failed") {
    CORDON_TRY(out, preview_of(engine_, session_, st.task_id, "stdout", settings_.preview_chars));
    r.preview = std::move(out);
    CORDON_TRY(err, preview_of(engine_, session_, st.task_id, "stderr", kStderrPreviewChars));
    r.stderr_preview = std::move(err);
  }
  return r;
}

// ---- the tools --------------------------------------------------------------------------------

Result<GitResult> log(Runner& runner, const LogRequest& req) {
  // Every value is checked before any job runs.
  std::string ref = req.ref.value_or("HEAD");
  CORDON_CHECK(check_ref("ref", ref));
  std::optional<std::string> path;
  if (req.path) {
    CORDON_TRY(p, check_path(runner.settings(), "path", *req.path));
    path = p;
  }
  if (req.since) {
    CORDON_CHECK(check_since(*req.since));
  }
  if (req.max_count < 1 || req.max_count > kMaxLogCount) {
    return refusal("maxCount {} is out of range: pass 1 to {}", req.max_count, kMaxLogCount);
  }
  CORDON_TRY(oid, runner.resolve("ref", ref));
  std::vector<std::string> args = {"log",           "--no-show-signature",
                                   "--no-ext-diff", "--no-textconv",
                                   "--no-decorate", fmt::format("--max-count={}", req.max_count)};
  if (req.since) {
    args.push_back("--since=" + *req.since);
  }
  switch (req.format) {
    case LogFormat::kOneline:
      args.push_back("--format=%H %cs %an: %s");
      break;
    case LogFormat::kFull:
      args.push_back("--format=fuller");
      break;
    case LogFormat::kStat:
      args.push_back("--format=medium");
      args.push_back("--stat");
      break;
    case LogFormat::kNameOnly:
      args.push_back("--format=%H %cs %an: %s");
      args.push_back("--name-only");
      break;
  }
  args.push_back("--end-of-options");
  args.push_back(oid);
  args.push_back("--");
  if (path) {
    args.push_back(*path);
  }
  return runner.run(args);
}

Result<GitResult> show(Runner& runner, const ShowRequest& req) {
  CORDON_CHECK(check_ref("ref", req.ref));
  std::optional<std::string> path;
  if (req.path) {
    CORDON_TRY(p, check_path(runner.settings(), "path", *req.path));
    if (p == ".") {
      return refusal(
          "path is the repository root; pass a file inside it, or leave path out "
          "to show the commit");
    }
    path = p;
  }
  CORDON_TRY(oid, runner.resolve("ref", req.ref));
  std::vector<std::string> args = {"show", "--no-show-signature", "--no-ext-diff", "--no-textconv",
                                   "--no-decorate"};
  if (path) {
    // <oid>:<path> names the blob at that revision; git does not apply textconv or filters
    // to it (and --no-textconv says so twice).
    args.push_back("--end-of-options");
    args.push_back(oid + ":" + *path);
  } else {
    args.push_back("--format=fuller");
    args.push_back("--stat");
    args.push_back("--patch");
    args.push_back("--end-of-options");
    args.push_back(oid);
  }
  return runner.run(args);
}

Result<GitResult> diff(Runner& runner, const DiffRequest& req) {
  if (!req.base) {
    return refusal(
        "git_diff needs a base: the revision to compare from (e.g. \"HEAD~1\" or \"main\"); "
        "head defaults to HEAD. The diff is between two commits' trees and never reads the "
        "worktree");
  }
  CORDON_CHECK(check_ref("base", *req.base));
  CORDON_CHECK(check_ref("head", req.head));
  std::optional<std::string> path;
  if (req.path) {
    CORDON_TRY(p, check_path(runner.settings(), "path", *req.path));
    path = p;
  }
  if (req.unified > kMaxUnified) {
    return refusal("unified {} is out of range: pass 0 to {}", req.unified, kMaxUnified);
  }
  CORDON_TRY(base, runner.resolve("base", *req.base));
  CORDON_TRY(head, runner.resolve("head", req.head));
  // Tree to tree only: a worktree diff would run clean filters and refresh the index.
  std::vector<std::string> args = {"diff", "--no-ext-diff", "--no-textconv"};
  if (req.name_only) {
    args.push_back("--name-only");
  } else {
    args.push_back(fmt::format("--unified={}", req.unified));
  }
  args.push_back("--end-of-options");
  args.push_back(base);
  args.push_back(head);
  args.push_back("--");
  if (path) {
    args.push_back(*path);
  }
  return runner.run(args);
}

Result<GitResult> blame(Runner& runner, const BlameRequest& req) {
  CORDON_TRY(path, check_path(runner.settings(), "path", req.path));
  if (path == ".") {
    return refusal("path is the repository root; git_blame needs a file");
  }
  CORDON_CHECK(check_ref("ref", req.ref));
  uint64_t start = req.line_start.value_or(1);
  if (start < 1 || start > kMaxLine ||
      (req.line_end && (*req.line_end < start || *req.line_end > kMaxLine))) {
    return refusal(
        "the line range {}..{} is not valid: lines count from 1 and lineEnd is at "
        "least lineStart",
        start, req.line_end ? std::to_string(*req.line_end) : std::string("end"));
  }
  CORDON_TRY(oid, runner.resolve("ref", req.ref));
  // Always at a revision (never the worktree file, which would run clean filters); no
  // textconv (which also ran the smudge filter). git 2.39's blame does not take
  // --end-of-options: the revision is an object id cordon resolved, the path follows "--".
  // --no-ignore-revs-file: blame.ignoreRevsFile names a file blame reads and quotes a line of
  // in its error; outside repoRoot it showed the first line of any file the sandbox sees (a
  // review, session 29). `-c blame.ignoreRevsFile=` cannot undo it: git sorts that list, and
  // reads the config's file (and dies on it) before the empty entry clears it.
  std::vector<std::string> args = {"blame", "--no-textconv", "--no-ignore-revs-file"};
  if (req.line_start || req.line_end) {
    args.push_back("-L");
    args.push_back(req.line_end ? fmt::format("{},{}", start, *req.line_end)
                                : fmt::format("{},", start));
  }
  args.push_back(oid);
  args.push_back("--");
  args.push_back(path);
  return runner.run(args);
}

Result<GitResult> merge_base(Runner& runner, const MergeBaseRequest& req) {
  CORDON_CHECK(check_ref("base", req.base));
  CORDON_CHECK(check_ref("head", req.head));
  CORDON_TRY(base, runner.resolve("base", req.base));
  CORDON_TRY(head, runner.resolve("head", req.head));
  return runner.run({"merge-base", "--end-of-options", base, head});
}

Result<GitResult> ls_files(Runner& runner, const LsFilesRequest& req) {
  // Not --end-of-options here: ls-files would take the "--" after it as a pathspec (and list
  // nothing). "--" alone ends its options; the path after it is never read as one.
  std::vector<std::string> args = {"ls-files", "--"};
  if (req.path) {
    CORDON_TRY(p, check_path(runner.settings(), "path", *req.path));
    args.push_back(p);
  }
  return runner.run(args);
}

}  // namespace cordon::git
