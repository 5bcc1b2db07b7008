// The send-keys grammar and the terminal-mode tracker (src/engine/keys.cpp). Invariants:
//  - encode_key is deterministic, never empty on success, and an error names the token; a
//    token that is not a key form (no modifier prefix, not F<digits>, not ^x, not a name) is
//    literal text written as is;
//  - the mode only changes cursor keys (ESC [ x becomes ESC O x, nothing else);
//  - encode_paste never lets a paste end early: its inside holds no ESC[200~ / ESC[201~, only
//    removes whole 6-byte markers, leaves text without ESC unchanged, and is wrapped exactly
//    when bracketed paste is on;
//  - encode_write is data + paste + keys + CR + ^D in that order, and an error exactly when a
//    key is bad or nothing would be written;
//  - ModeTracker ends in the same modes however its input is split.

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "engine/keys.hpp"
#include "fuzz/fuzz_check.hpp"

namespace {

using cordon::fuzz::show;
namespace eng = cordon::engine;

const char* kTokens[] = {"Up",      "C-Up",   "M-S-Left", "Home",  "End",     "F1",      "F5",
                         "F12",     "F13",    "F0",       "C-a",   "M-x",     "S-a",     "^c",
                         "^?",      "C-?",    "BTab",     "S-Tab", "M-Enter", "C-Enter", "Space",
                         "C-Space", "BSpace", "C-M-x",    "IC",    "DC",      "PPage",   "NPage",
                         "PgUp",    "Escape", "c-",       "M-",    "é",       "C-é",     "hello",
                         "-",       "^",      "^ab",      "C-1",   "C-8",     "C-/"};

bool ci_prefix(std::string_view t, std::string_view p) {
  if (t.size() < p.size()) {
    return false;
  }
  for (size_t i = 0; i < p.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(t[i])) != p[i]) {
      return false;
    }
  }
  return true;
}

// Tokens that can never be a key: literal text.
bool surely_literal(std::string_view t) {
  if (t.size() < 2) {
    return false;  // a single character may be a key (and is written as itself anyway)
  }
  if (ci_prefix(t, "c-") || ci_prefix(t, "m-") || ci_prefix(t, "s-") || t[0] == '^' ||
      t[0] == 'F' || t[0] == 'f') {
    return false;
  }
  // Names are ASCII letters only; anything with a non-letter cannot be one.
  return std::any_of(t.begin(), t.end(),
                     [](char c) { return !std::isalpha(static_cast<unsigned char>(c)); });
}

std::string strip_markers_check(const std::string& inside, const std::string& text) {
  FUZZ_CHECK(inside.find("\x1b[201~") == std::string::npos &&
                 inside.find("\x1b[200~") == std::string::npos,
             "a paste marker survives in `{}` from `{}`", show(inside), show(text));
  // inside is text with whole markers removed: a subsequence, 6 bytes per marker.
  size_t j = 0;
  for (char c : text) {
    if (j < inside.size() && inside[j] == c) {
      ++j;
    }
  }
  FUZZ_CHECK(j == inside.size(), "paste `{}` is not a subsequence of `{}`", show(inside),
             show(text));
  FUZZ_CHECK((text.size() - inside.size()) % 6 == 0, "paste removed {} bytes",
             text.size() - inside.size());
  if (text.find('\x1b') == std::string::npos) {
    FUZZ_CHECK(inside == text, "a paste without ESC changed");
  }
  return inside;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  eng::TerminalModes normal, app;
  app.application_cursor = true;
  eng::TerminalModes bracketed;
  bracketed.bracketed_paste = true;

  // Keys.
  std::vector<std::string> tokens;
  size_t n = fdp.ConsumeIntegralInRange<size_t>(0, 6);
  for (size_t i = 0; i < n; ++i) {
    tokens.push_back(fdp.ConsumeBool() ? std::string(fdp.PickValueInArray(kTokens))
                                       : fdp.ConsumeRandomLengthString(10));
  }
  bool all_ok = true;
  std::string keys_bytes;
  for (const auto& t : tokens) {
    auto a = eng::encode_key(t, normal);
    auto b = eng::encode_key(t, normal);
    auto c = eng::encode_key(t, app);
    FUZZ_CHECK(a.has_value() == b.has_value() && (!a || *a == *b), "encode_key(`{}`) varies",
               show(t));
    FUZZ_CHECK(a.has_value() == c.has_value(), "`{}` valid in one cursor mode only", show(t));
    if (!a) {
      all_ok = false;
      FUZZ_CHECK(a.error().code() == cordon::ErrorCode::kInvalid, "`{}`: kind {}", show(t),
                 static_cast<int>(a.error().code()));
      FUZZ_CHECK(!a.error().message().empty(), "an error without a message");
      FUZZ_CHECK(!surely_literal(t), "literal text `{}` refused: {}", show(t), a.error().message());
      continue;
    }
    FUZZ_CHECK(!a->empty(), "`{}` encodes to nothing", show(t));
    if (surely_literal(t)) {
      FUZZ_CHECK(*a == t, "literal `{}` written as `{}`", show(t), show(*a));
    }
    if (*a != *c) {
      FUZZ_CHECK(a->size() == 3 && c->size() == 3 && (*a)[0] == '\x1b' && (*a)[1] == '[' &&
                     (*c)[0] == '\x1b' && (*c)[1] == 'O' && (*a)[2] == (*c)[2],
                 "`{}`: `{}` vs `{}` in application cursor mode", show(t), show(*a), show(*c));
    }
    keys_bytes += *a;
  }

  // Paste.
  std::string text = fdp.ConsumeRandomLengthString(64);
  std::string plain = eng::encode_paste(text, normal);
  strip_markers_check(plain, text);
  std::string br = eng::encode_paste(text, bracketed);
  if (plain.empty()) {
    FUZZ_CHECK(br.empty(), "an empty paste is bracketed: `{}`", show(br));
  } else {
    FUZZ_CHECK(br == "\x1b[200~" + plain + "\x1b[201~", "bracketed `{}` vs plain `{}`", show(br),
               show(plain));
  }

  // The whole request.
  eng::WriteRequest w;
  if (fdp.ConsumeBool()) {
    w.data = fdp.ConsumeRandomLengthString(16);
  }
  if (fdp.ConsumeBool()) {
    w.paste = text;
  }
  w.keys = tokens;
  w.submit = fdp.ConsumeBool();
  w.eof = fdp.ConsumeBool();
  auto out = eng::encode_write(w, normal);
  std::string want = w.data.value_or("") + (w.paste ? plain : "") + keys_bytes +
                     (w.submit ? "\r" : "") + (w.eof ? "\x04" : "");
  if (!all_ok || want.empty()) {
    FUZZ_CHECK(!out.has_value(), "encode_write accepted a bad or empty request");
  } else {
    FUZZ_CHECK(out.has_value() && *out == want, "encode_write gave `{}`, want `{}`",
               out ? show(*out) : out.error().message(), show(want));
  }

  // The tracker, whole against split.
  std::string stream = fdp.ConsumeRemainingBytesAsString();
  eng::ModeTracker whole, bytewise, halves;
  whole.feed(stream);
  for (char c : stream) {
    bytewise.feed(std::string_view(&c, 1));
  }
  size_t cut = stream.size() / 3;
  halves.feed(std::string_view(stream).substr(0, cut));
  halves.feed(std::string_view(stream).substr(cut));
  auto same = [](const eng::TerminalModes& x, const eng::TerminalModes& y) {
    return x.application_cursor == y.application_cursor && x.bracketed_paste == y.bracketed_paste;
  };
  FUZZ_CHECK(same(whole.modes(), bytewise.modes()) && same(whole.modes(), halves.modes()),
             "the modes depend on how `{}` was split", show(stream));
  return 0;
}
