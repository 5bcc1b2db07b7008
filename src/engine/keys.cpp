#include "engine/keys.hpp"

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "base/strings.hpp"

namespace cordon::engine {
namespace {

constexpr char kEsc = '\x1b';
constexpr std::string_view kPasteBegin = "\x1b[200~";
constexpr std::string_view kPasteEnd = "\x1b[201~";

constexpr std::string_view kAccepted =
    "accepted: Enter, Tab, BTab, Escape, Space, BSpace, Up, Down, Left, Right, Home, End, "
    "PageUp (PgUp, PPage), PageDown (PgDn, NPage), Insert (IC), Delete (DC), F1-F12, or a "
    "single character, each optionally prefixed by C-, M- and/or S- (C-c, M-x, C-M-x, C-Left, "
    "S-Up, M-Enter), or ^x for C-x; other tokens without a prefix are sent as literal text, "
    "and literal text that looks like a key belongs in `data`";

struct Modifiers {
  bool ctrl = false, meta = false, shift = false;
  bool any() const { return ctrl || meta || shift; }
  // xterm's modifier parameter: 1 + Shift(1) + Alt(2) + Control(4).
  int xterm_param() const { return 1 + (shift ? 1 : 0) + (meta ? 2 : 0) + (ctrl ? 4 : 0); }
};

enum class KeyKind {
  kCursor,  // arrows, Home, End: CSI/SS3 + final, DECCKM-dependent
  kSs3,     // F1-F4: SS3 + final
  kTilde,   // CSI n ~
  kEnter,
  kTab,
  kBTab,
  kEscape,
  kSpace,
  kBSpace,
};

struct NamedKey {
  std::string_view name;
  KeyKind kind;
  char final_byte;  // kCursor, kSs3
  int number;       // kTilde
};

constexpr std::array kNamedKeys = {
    NamedKey{"Up", KeyKind::kCursor, 'A', 0},    NamedKey{"Down", KeyKind::kCursor, 'B', 0},
    NamedKey{"Right", KeyKind::kCursor, 'C', 0}, NamedKey{"Left", KeyKind::kCursor, 'D', 0},
    NamedKey{"Home", KeyKind::kCursor, 'H', 0},  NamedKey{"End", KeyKind::kCursor, 'F', 0},
    NamedKey{"Insert", KeyKind::kTilde, 0, 2},   NamedKey{"IC", KeyKind::kTilde, 0, 2},
    NamedKey{"Delete", KeyKind::kTilde, 0, 3},   NamedKey{"DC", KeyKind::kTilde, 0, 3},
    NamedKey{"PageUp", KeyKind::kTilde, 0, 5},   NamedKey{"PgUp", KeyKind::kTilde, 0, 5},
    NamedKey{"PPage", KeyKind::kTilde, 0, 5},    NamedKey{"PageDown", KeyKind::kTilde, 0, 6},
    NamedKey{"PgDn", KeyKind::kTilde, 0, 6},     NamedKey{"NPage", KeyKind::kTilde, 0, 6},
    NamedKey{"F1", KeyKind::kSs3, 'P', 0},       NamedKey{"F2", KeyKind::kSs3, 'Q', 0},
    NamedKey{"F3", KeyKind::kSs3, 'R', 0},       NamedKey{"F4", KeyKind::kSs3, 'S', 0},
    NamedKey{"F5", KeyKind::kTilde, 0, 15},      NamedKey{"F6", KeyKind::kTilde, 0, 17},
    NamedKey{"F7", KeyKind::kTilde, 0, 18},      NamedKey{"F8", KeyKind::kTilde, 0, 19},
    NamedKey{"F9", KeyKind::kTilde, 0, 20},      NamedKey{"F10", KeyKind::kTilde, 0, 21},
    NamedKey{"F11", KeyKind::kTilde, 0, 23},     NamedKey{"F12", KeyKind::kTilde, 0, 24},
    NamedKey{"Enter", KeyKind::kEnter, 0, 0},    NamedKey{"Tab", KeyKind::kTab, 0, 0},
    NamedKey{"BTab", KeyKind::kBTab, 0, 0},      NamedKey{"Escape", KeyKind::kEscape, 0, 0},
    NamedKey{"Space", KeyKind::kSpace, 0, 0},    NamedKey{"BSpace", KeyKind::kBSpace, 0, 0},
};

char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) {
      return false;
    }
  }
  return true;
}

const NamedKey* find_named(std::string_view name) {
  for (const auto& key : kNamedKeys) {
    if (iequals(key.name, name)) {
      return &key;
    }
  }
  return nullptr;
}

// "F" followed by digits: a function key name, valid or not (F13 must not become literal text).
bool looks_like_function_key(std::string_view s) {
  if (s.size() < 2 || (s[0] != 'F' && s[0] != 'f')) {
    return false;
  }
  for (char c : s.substr(1)) {
    if (c < '0' || c > '9') {
      return false;
    }
  }
  return true;
}

// True when `s` is exactly one UTF-8 encoded code point.
bool is_single_code_point(std::string_view s) {
  if (s.empty()) {
    return false;
  }
  auto lead = static_cast<unsigned char>(s[0]);
  size_t len = lead < 0x80           ? 1
               : (lead >> 5) == 0x6  ? 2
               : (lead >> 4) == 0xe  ? 3
               : (lead >> 3) == 0x1e ? 4
                                     : 0;
  if (len == 0 || s.size() != len) {
    return false;
  }
  for (size_t i = 1; i < len; ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) {
      return false;
    }
  }
  return true;
}

// The token is shown with its control characters escaped, so a message naming a hostile token
// cannot itself drive a terminal.
std::unexpected<Error> bad_token(std::string_view token, std::string_view why) {
  return invalid("key `{}`: {}; {}", escape_controls(token, ""), why, kAccepted);
}

// C-x for a single ASCII character, as xterm and tmux map it to a C0 control; nullopt where a
// legacy terminal has no control code for it.
std::optional<char> control_of(char c) {
  if (c >= '@' && c <= '~') {
    return static_cast<char>(c & 0x1f);
  }
  switch (c) {
    case '?':
    case '8':
      return '\x7f';
    case ' ':
    case '2':
      return '\0';
    case '/':
    case '-':
      return '\x1f';
    default:
      break;
  }
  if (c >= '3' && c <= '7') {
    return static_cast<char>(c - '3' + 0x1b);
  }
  return std::nullopt;
}

Result<std::string> encode_named(std::string_view token, const NamedKey& key, Modifiers mods,
                                 const TerminalModes& modes) {
  std::string meta_prefix = mods.meta ? std::string(1, kEsc) : std::string();
  switch (key.kind) {
    case KeyKind::kCursor:
      if (mods.any()) {
        // xterm reports modified cursor keys as CSI 1;m X in either DECCKM mode.
        return fmt::format("\x1b[1;{}{}", mods.xterm_param(), key.final_byte);
      }
      return fmt::format("\x1b{}{}", modes.application_cursor ? 'O' : '[', key.final_byte);
    case KeyKind::kSs3:
      if (mods.any()) {
        return fmt::format("\x1b[1;{}{}", mods.xterm_param(), key.final_byte);
      }
      return fmt::format("\x1bO{}", key.final_byte);
    case KeyKind::kTilde:
      if (mods.any()) {
        return fmt::format("\x1b[{};{}~", key.number, mods.xterm_param());
      }
      return fmt::format("\x1b[{}~", key.number);
    case KeyKind::kEnter:
      if (mods.ctrl || mods.shift) {
        return bad_token(token, "a terminal sends C-Enter and S-Enter as plain Enter");
      }
      return meta_prefix + "\r";
    case KeyKind::kTab:
      if (mods.ctrl) {
        return bad_token(token, "a terminal sends C-Tab as plain Tab");
      }
      return meta_prefix + (mods.shift ? "\x1b[Z" : "\t");
    case KeyKind::kBTab:
      if (mods.ctrl) {
        return bad_token(token, "C-BTab has no terminal encoding");
      }
      return meta_prefix + "\x1b[Z";  // BTab is already S-Tab; S- adds nothing
    case KeyKind::kEscape:
      if (mods.ctrl || mods.shift) {
        return bad_token(token, "a terminal sends C-Escape and S-Escape as plain Escape");
      }
      return meta_prefix + "\x1b";
    case KeyKind::kSpace:
      if (mods.shift) {
        return bad_token(token, "a terminal sends S-Space as plain Space");
      }
      return meta_prefix + (mods.ctrl ? std::string(1, '\0') : std::string(" "));
    case KeyKind::kBSpace:
      if (mods.shift) {
        return bad_token(token, "a terminal sends S-BSpace as plain BSpace");
      }
      // DEL is what xterm (and tmux) send for Backspace; C-BSpace is ^H.
      return meta_prefix + (mods.ctrl ? "\x08" : "\x7f");
  }
  return bad_token(token, "unknown key kind");
}

Result<std::string> encode_char(std::string_view token, std::string_view ch, Modifiers mods) {
  std::string out = mods.meta ? std::string(1, kEsc) : std::string();
  bool ascii = ch.size() == 1 && static_cast<unsigned char>(ch[0]) < 0x80;
  if (mods.ctrl && mods.shift) {
    return bad_token(token, "a terminal cannot tell C-S-x from C-x; use C-x");
  }
  if (mods.shift) {
    if (!ascii || !((ch[0] >= 'a' && ch[0] <= 'z') || (ch[0] >= 'A' && ch[0] <= 'Z'))) {
      return bad_token(token,
                       "S- applies to letters only (what shift makes of other characters "
                       "depends on the keyboard layout); send the shifted character");
    }
    out += static_cast<char>(ch[0] & ~0x20);
    return out;
  }
  if (mods.ctrl) {
    std::optional<char> control = ascii ? control_of(ch[0]) : std::nullopt;
    if (!control) {
      return bad_token(token,
                       "this character has no control code (C-@..C-~, C-?, C-Space, "
                       "C-2..C-8, C-/, C-- do)");
    }
    out += *control;
    return out;
  }
  out += ch;
  return out;
}

}  // namespace

Result<std::string> encode_key(std::string_view token, const TerminalModes& modes) {
  if (token.empty()) {
    return bad_token(token, "empty token");
  }
  Modifiers mods;
  bool had_prefix = false;
  std::string_view rest = token;
  while (rest.size() >= 2 && rest[1] == '-') {
    char m = ascii_lower(rest[0]);
    if (m == 'c') {
      mods.ctrl = true;
    } else if (m == 'm') {
      mods.meta = true;
    } else if (m == 's') {
      mods.shift = true;
    } else {
      break;
    }
    had_prefix = true;
    rest.remove_prefix(2);
  }
  if (rest.empty()) {
    return bad_token(token, "a modifier prefix needs a key after it");
  }
  // ^x is caret notation for C-x; "^" alone or followed by more than one character is text.
  if (rest.size() >= 2 && rest[0] == '^' && is_single_code_point(rest.substr(1))) {
    mods.ctrl = true;
    rest.remove_prefix(1);
  }
  if (const NamedKey* key = find_named(rest)) {
    return encode_named(token, *key, mods, modes);
  }
  if (looks_like_function_key(rest)) {
    return bad_token(token, "function keys are F1-F12");
  }
  if (is_single_code_point(rest)) {
    return encode_char(token, rest, mods);
  }
  if (had_prefix || mods.ctrl) {
    return bad_token(token, "not a key name or a single character");
  }
  // tmux send-keys writes a token it does not know as literal text; so do we.
  return std::string(token);
}

// Failure fixed (a review, session 13): a pasted ^C ended a program reading a line with
// SIGINT; a ^D, ^U or DEL edits or ends the line: the line discipline acts on these bytes
// whatever the paste's brackets say. They are dropped from a paste, as terminals drop control
// bytes from one (xterm's default allowPasteControls: false), but only the ones the terminal's
// termios gives a meaning now: a raw-mode program (readline) still gets a pasted ^A as text.
std::string line_controls(const struct termios& t) {
  std::string out;
  auto add = [&](int index) {
    unsigned char c = t.c_cc[index];
    if (c != _POSIX_VDISABLE && c != '\t' && c != '\n' && c != '\r' &&
        out.find(static_cast<char>(c)) == std::string::npos) {
      out += static_cast<char>(c);
    }
  };
  if ((t.c_lflag & ISIG) != 0) {
    for (int i : {VINTR, VQUIT, VSUSP}) add(i);
  }
  if ((t.c_lflag & ICANON) != 0) {
    for (int i : {VEOF, VERASE, VKILL, VEOL, VEOL2}) add(i);
    if ((t.c_lflag & IEXTEN) != 0) {
      for (int i : {VWERASE, VLNEXT, VREPRINT}) add(i);
    }
  }
  if ((t.c_iflag & IXON) != 0) {
    for (int i : {VSTOP, VSTART}) add(i);
  }
  return out;
}

struct termios fresh_pty_termios() {
  struct termios t {};
  t.c_iflag = ICRNL | IXON;
  t.c_lflag = ISIG | ICANON | IEXTEN | ECHO;
  t.c_cc[VINTR] = 0x03;
  t.c_cc[VQUIT] = 0x1c;
  t.c_cc[VSUSP] = 0x1a;
  t.c_cc[VEOF] = 0x04;
  t.c_cc[VERASE] = 0x7f;
  t.c_cc[VKILL] = 0x15;
  t.c_cc[VWERASE] = 0x17;
  t.c_cc[VLNEXT] = 0x16;
  t.c_cc[VREPRINT] = 0x12;
  t.c_cc[VSTOP] = 0x13;
  t.c_cc[VSTART] = 0x11;
  return t;
}

std::string encode_paste(std::string_view text, const TerminalModes& modes) {
  // Remove the markers while appending, checking only the tail: a marker that forms once an
  // inner one is removed ("\e[20" "\e[201~" "1~") ends at a byte appended later and is caught
  // then, so one pass leaves none.
  std::string body;
  body.reserve(text.size());
  for (char c : text) {
    const char seen = modes.strip_high_bit ? static_cast<char>(c & 0x7f) : c;
    if (modes.line_controls.find(seen) != std::string::npos) {
      continue;
    }
    body += c;
    if (seen == '~' && body.size() >= kPasteEnd.size()) {
      // The markers as the program will read them (with ISTRIP, high bits cleared).
      std::string tail = body.substr(body.size() - kPasteEnd.size());
      if (modes.strip_high_bit) {
        for (char& t : tail) t = static_cast<char>(t & 0x7f);
      }
      if (tail == kPasteEnd || tail == kPasteBegin) {
        body.resize(body.size() - kPasteEnd.size());
      }
    }
  }
  if (body.empty()) {
    return body;
  }
  if (!modes.bracketed_paste) {
    return body;
  }
  std::string out;
  out.reserve(body.size() + kPasteBegin.size() + kPasteEnd.size());
  out.append(kPasteBegin).append(body).append(kPasteEnd);
  return out;
}

Result<std::string> encode_write(const WriteRequest& request, const TerminalModes& modes) {
  std::string out;
  if (request.data) {
    out += *request.data;
  }
  if (request.paste) {
    out += encode_paste(*request.paste, modes);
  }
  for (size_t i = 0; i < request.keys.size(); ++i) {
    CORDON_TRY_CTX(bytes, encode_key(request.keys[i], modes), "keys[{}]", i);
    out += bytes;
  }
  if (request.submit) {
    out += '\r';
  }
  if (request.eof) {
    // VEOF's default. The line discipline ends input with it only at the start of a line;
    // after a partial line it hands that line over without a newline instead.
    out += '\x04';
  }
  if (out.empty()) {
    return invalid(
        "command_write: nothing to write; give data, paste, keys, submit or eof (an empty "
        "string or a paste of only bracketed-paste markers writes nothing)");
  }
  return out;
}

// ---- ModeTracker ----------------------------------------------------------------------------

void ModeTracker::feed(std::string_view output) {
  for (char ch : output) {
    auto c = static_cast<unsigned char>(ch);
    // ESC starts a new sequence from any state (it aborts an unfinished one, as in a VT
    // parser); CAN and SUB cancel one.
    if (c == 0x1b) {
      state_ = State::kEscape;
      continue;
    }
    if (c == 0x18 || c == 0x1a) {
      state_ = State::kGround;
      continue;
    }
    switch (state_) {
      case State::kGround:
        break;
      case State::kEscape:
        if (c == '[') {
          state_ = State::kCsi;
          private_ = false;
          intermediate_ = 0;
          param_ = 0;
          param_overflow_ = false;
          saw_cursor_mode_ = saw_paste_mode_ = false;
          first_csi_byte_ = true;
        } else if (c == 'c') {  // RIS, full reset: xterm turns both modes off
          modes_ = TerminalModes{};
          state_ = State::kGround;
        } else if (c >= 0x20 && c <= 0x2f) {
          state_ = State::kEscapeIntermediate;  // e.g. ESC ( B: wait for its final byte
        } else if (c >= 0x20) {
          state_ = State::kGround;
        }
        // C0 controls inside an escape are executed by a terminal and do not end it.
        break;
      case State::kEscapeIntermediate:
        if (c >= 0x30) {
          state_ = State::kGround;  // the final byte; ESC ( c is not a reset
        }
        break;
      case State::kCsi:
      case State::kCsiIgnore:
        if (c < 0x20) {
          break;  // executed by the terminal, the sequence goes on
        }
        if (c >= 0x80) {
          state_ = State::kGround;
          break;
        }
        if (c >= 0x40 && c <= 0x7e) {
          if (state_ == State::kCsi) {
            end_param();
            dispatch_csi(static_cast<char>(c));
          }
          state_ = State::kGround;
          break;
        }
        if (state_ == State::kCsiIgnore) {
          break;
        }
        if (c >= 0x20 && c <= 0x2f) {
          intermediate_ = static_cast<char>(c);
        } else if (intermediate_ != 0) {
          state_ = State::kCsiIgnore;  // a parameter after an intermediate: malformed
        } else if (c >= '0' && c <= '9') {
          param_ = param_ * 10 + (c - '0');
          if (param_ > 99999) {
            param_overflow_ = true;
            param_ = 99999;
          }
        } else if (c == ';') {
          end_param();
        } else if (c == '?' && first_csi_byte_) {
          private_ = true;
        } else {
          // ':' sub-parameters or a private marker in the middle: not a DECSET we know.
          state_ = State::kCsiIgnore;
        }
        first_csi_byte_ = false;
        break;
    }
  }
}

void ModeTracker::end_param() {
  if (!param_overflow_) {
    if (param_ == 1) {
      saw_cursor_mode_ = true;
    } else if (param_ == 2004) {
      saw_paste_mode_ = true;
    }
  }
  param_ = 0;
  param_overflow_ = false;
}

void ModeTracker::dispatch_csi(char final_byte) {
  if (private_ && intermediate_ == 0 && (final_byte == 'h' || final_byte == 'l')) {
    bool on = final_byte == 'h';
    if (saw_cursor_mode_) {
      modes_.application_cursor = on;
    }
    if (saw_paste_mode_) {
      modes_.bracketed_paste = on;
    }
  } else if (!private_ && intermediate_ == '!' && final_byte == 'p') {
    modes_.application_cursor = false;  // DECSTR, soft reset: cursor keys back to normal
  }
}

}  // namespace cordon::engine
