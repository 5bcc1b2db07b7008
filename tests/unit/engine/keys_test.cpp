#define BOOST_TEST_MODULE engine_keys
#include "engine/keys.hpp"

#include <boost/test/unit_test.hpp>
#include <string>
#include <string_view>
#include <vector>

using namespace cordon;
using namespace cordon::engine;

namespace {

const TerminalModes kNormal{};
const TerminalModes kAppCursor{.application_cursor = true, .bracketed_paste = false};
const TerminalModes kBracketed{.application_cursor = false, .bracketed_paste = true};

std::string key(std::string_view token, const TerminalModes& modes = kNormal) {
  auto r = encode_key(token, modes);
  // Boost builds the message even when the check passes, so read error() only on failure.
  if (!r.has_value()) {
    BOOST_FAIL("token `" << token << "`: " << r.error().message());
  }
  return *r;
}

// The documented table (keys.hpp): token, bytes without and with application cursor mode.
struct Row {
  std::string_view token;
  std::string_view normal;
  std::string_view app;
};
const std::vector<Row> kTable = {
    {"Up", "\x1b[A", "\x1bOA"},
    {"Down", "\x1b[B", "\x1bOB"},
    {"Right", "\x1b[C", "\x1bOC"},
    {"Left", "\x1b[D", "\x1bOD"},
    {"Home", "\x1b[H", "\x1bOH"},
    {"End", "\x1b[F", "\x1bOF"},
    {"Insert", "\x1b[2~", "\x1b[2~"},
    {"IC", "\x1b[2~", "\x1b[2~"},
    {"Delete", "\x1b[3~", "\x1b[3~"},
    {"DC", "\x1b[3~", "\x1b[3~"},
    {"PageUp", "\x1b[5~", "\x1b[5~"},
    {"PgUp", "\x1b[5~", "\x1b[5~"},
    {"PPage", "\x1b[5~", "\x1b[5~"},
    {"PageDown", "\x1b[6~", "\x1b[6~"},
    {"PgDn", "\x1b[6~", "\x1b[6~"},
    {"NPage", "\x1b[6~", "\x1b[6~"},
    {"F1", "\x1bOP", "\x1bOP"},
    {"F2", "\x1bOQ", "\x1bOQ"},
    {"F3", "\x1bOR", "\x1bOR"},
    {"F4", "\x1bOS", "\x1bOS"},
    {"F5", "\x1b[15~", "\x1b[15~"},
    {"F6", "\x1b[17~", "\x1b[17~"},
    {"F7", "\x1b[18~", "\x1b[18~"},
    {"F8", "\x1b[19~", "\x1b[19~"},
    {"F9", "\x1b[20~", "\x1b[20~"},
    {"F10", "\x1b[21~", "\x1b[21~"},
    {"F11", "\x1b[23~", "\x1b[23~"},
    {"F12", "\x1b[24~", "\x1b[24~"},
    {"Enter", "\r", "\r"},
    {"Tab", "\t", "\t"},
    {"BTab", "\x1b[Z", "\x1b[Z"},
    {"Escape", "\x1b", "\x1b"},
    {"Space", " ", " "},
    {"BSpace", "\x7f", "\x7f"},
    {"a", "a", "a"},
    {"Z", "Z", "Z"},
    {"~", "~", "~"},
    {"\xc3\xa9", "\xc3\xa9", "\xc3\xa9"},  // é, one code point in UTF-8
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_table_token_with_and_without_application_cursor_mode) {
  for (const Row& row : kTable) {
    BOOST_TEST_CONTEXT("token " << row.token) {
      BOOST_TEST(key(row.token, kNormal) == row.normal);
      BOOST_TEST(key(row.token, kAppCursor) == row.app);
      // Bracketed paste changes no key.
      BOOST_TEST(key(row.token, kBracketed) == row.normal);
    }
  }
}

BOOST_AUTO_TEST_CASE(names_and_modifier_letters_are_case_insensitive) {
  BOOST_TEST(key("enter") == "\r");
  BOOST_TEST(key("PAGEUP") == "\x1b[5~");
  BOOST_TEST(key("f12") == "\x1b[24~");
  BOOST_TEST(key("c-c") == "\x03");
  BOOST_TEST(key("m-x") == "\x1bx");
  BOOST_TEST(key("s-up") == "\x1b[1;2A");
}

BOOST_AUTO_TEST_CASE(modified_special_keys_use_xterm_parameters_in_both_cursor_modes) {
  struct Mod {
    std::string_view prefix;
    int param;
  };
  const std::vector<Mod> mods = {{"S-", 2},   {"M-", 3},   {"S-M-", 4},   {"C-", 5},
                                 {"C-S-", 6}, {"C-M-", 7}, {"C-M-S-", 8}, {"M-C-", 7}};
  struct Special {
    std::string_view name;
    std::string_view csi_prefix, final_str;  // bytes are CSI <prefix>;<m><final>
  };
  const std::vector<Special> specials = {
      {"Up", "1", "A"},     {"Down", "1", "B"},     {"Right", "1", "C"},  {"Left", "1", "D"},
      {"Home", "1", "H"},   {"End", "1", "F"},      {"F1", "1", "P"},     {"F2", "1", "Q"},
      {"F3", "1", "R"},     {"F4", "1", "S"},       {"Insert", "2", "~"}, {"Delete", "3", "~"},
      {"PageUp", "5", "~"}, {"PageDown", "6", "~"}, {"F5", "15", "~"},    {"F6", "17", "~"},
      {"F7", "18", "~"},    {"F8", "19", "~"},      {"F9", "20", "~"},    {"F10", "21", "~"},
      {"F11", "23", "~"},   {"F12", "24", "~"},
  };
  for (const auto& m : mods) {
    for (const auto& s : specials) {
      std::string token = std::string(m.prefix) + std::string(s.name);
      std::string want = "\x1b[" + std::string(s.csi_prefix) + ";" + std::to_string(m.param) +
                         std::string(s.final_str);
      BOOST_TEST_CONTEXT("token " << token) {
        BOOST_TEST(key(token, kNormal) == want);
        BOOST_TEST(key(token, kAppCursor) == want);
      }
    }
  }
  BOOST_TEST(key("C-Left") == "\x1b[1;5D");
  BOOST_TEST(key("S-Up") == "\x1b[1;2A");
}

BOOST_AUTO_TEST_CASE(control_meta_and_shift_on_characters) {
  BOOST_TEST(key("C-a") == "\x01");
  BOOST_TEST(key("C-A") == "\x01");
  BOOST_TEST(key("C-c") == "\x03");
  BOOST_TEST(key("C-d") == "\x04");
  BOOST_TEST(key("C-z") == "\x1a");
  BOOST_TEST(key("C-@") == std::string(1, '\0'));
  BOOST_TEST(key("C-[") == "\x1b");
  BOOST_TEST(key("C-\\") == "\x1c");
  BOOST_TEST(key("C-]") == "\x1d");
  BOOST_TEST(key("C-^") == "\x1e");
  BOOST_TEST(key("C-_") == "\x1f");
  BOOST_TEST(key("C-?") == "\x7f");
  BOOST_TEST(key("C-Space") == std::string(1, '\0'));
  BOOST_TEST(key("C- ") == std::string(1, '\0'));
  BOOST_TEST(key("C-2") == std::string(1, '\0'));
  BOOST_TEST(key("C-3") == "\x1b");
  BOOST_TEST(key("C-7") == "\x1f");
  BOOST_TEST(key("C-8") == "\x7f");
  BOOST_TEST(key("C-/") == "\x1f");
  BOOST_TEST(key("C--") == "\x1f");
  BOOST_TEST(key("M-x") == "\x1bx");
  BOOST_TEST(key("M-X") == "\x1bX");
  BOOST_TEST(key("M--") == "\x1b-");
  BOOST_TEST(key("M-\xc3\xa9") == "\x1b\xc3\xa9");
  BOOST_TEST(key("C-M-x") == "\x1b\x18");
  BOOST_TEST(key("M-C-x") == "\x1b\x18");
  BOOST_TEST(key("S-a") == "A");
  BOOST_TEST(key("S-A") == "A");
  BOOST_TEST(key("M-S-a") ==
             "\x1b"
             "A");
  BOOST_TEST(key("C-C-c") == "\x03");  // a repeated modifier is harmless, as in tmux
}

BOOST_AUTO_TEST_CASE(modifiers_on_enter_tab_escape_space_backspace) {
  BOOST_TEST(key("M-Enter") == "\x1b\r");
  BOOST_TEST(key("M-Tab") == "\x1b\t");
  BOOST_TEST(key("S-Tab") == "\x1b[Z");
  BOOST_TEST(key("M-S-Tab") == "\x1b\x1b[Z");
  BOOST_TEST(key("S-BTab") == "\x1b[Z");
  BOOST_TEST(key("M-BTab") == "\x1b\x1b[Z");
  BOOST_TEST(key("M-Escape") == "\x1b\x1b");
  BOOST_TEST(key("M-Space") == "\x1b ");
  BOOST_TEST(key("C-M-Space") == std::string("\x1b\0", 2));
  BOOST_TEST(key("C-BSpace") == "\x08");
  BOOST_TEST(key("M-BSpace") == "\x1b\x7f");
  BOOST_TEST(key("C-M-BSpace") == "\x1b\x08");
}

BOOST_AUTO_TEST_CASE(caret_notation_is_control) {
  BOOST_TEST(key("^C") == "\x03");
  BOOST_TEST(key("^c") == "\x03");
  BOOST_TEST(key("^D") == "\x04");
  BOOST_TEST(key("^[") == "\x1b");
  BOOST_TEST(key("^@") == std::string(1, '\0'));
  BOOST_TEST(key("^?") == "\x7f");
  BOOST_TEST(key("^^") == "\x1e");
  BOOST_TEST(key("M-^A") == "\x1b\x01");
  for (char c = 'A'; c <= 'Z'; ++c) {
    BOOST_TEST(key(std::string("^") + c) == key(std::string("C-") + c));
  }
  // "^" alone and "^" before more than one character are text, as in tmux.
  BOOST_TEST(key("^") == "^");
  BOOST_TEST(key("^ab") == "^ab");
}

BOOST_AUTO_TEST_CASE(unknown_tokens_without_a_prefix_are_literal_text) {
  BOOST_TEST(key("hello") == "hello");
  BOOST_TEST(key("ls -la") == "ls -la");
  BOOST_TEST(key("-") == "-");
  BOOST_TEST(key("F") == "F");
  BOOST_TEST(key("Fx") == "Fx");
  BOOST_TEST(key("\xe2\x82\xac uro") == "\xe2\x82\xac uro");
  BOOST_TEST(key("x-y") == "x-y");
}

BOOST_AUTO_TEST_CASE(malformed_tokens_are_invalid_and_named) {
  const std::vector<std::string> bad = {
      "",         "C-",         "M-",      "S-",       "C-M-",    "c-",    "F13",
      "F0",       "f99",        "C-F13",   "C-hello",  "M-foo",   "S-1",   "S-\xc3\xa9",
      "C-1",      "C-\xc3\xa9", "C-S-a",   "C-Enter",  "S-Enter", "C-Tab", "C-BTab",
      "C-Escape", "S-Escape",   "S-Space", "S-BSpace", "^1",      "C-^ab",
  };
  for (const auto& token : bad) {
    BOOST_TEST_CONTEXT("token `" << token << "`") {
      auto r = encode_key(token, kNormal);
      BOOST_REQUIRE(!r.has_value());
      BOOST_TEST(static_cast<int>(r.error().code()) == static_cast<int>(ErrorCode::kInvalid));
      const std::string& msg = r.error().message();
      BOOST_TEST(msg.find("key `" + token + "`") != std::string::npos, msg);
      BOOST_TEST(msg.find("accepted: Enter, Tab, BTab") != std::string::npos, msg);
      BOOST_TEST(msg.find("F1-F12") != std::string::npos, msg);
    }
  }
}

BOOST_AUTO_TEST_CASE(error_names_control_bytes_in_a_token_escaped) {
  auto r = encode_key("C-\x1b[31mx", kNormal);
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("key `C-\\x1b[31mx`") != std::string::npos);
  BOOST_TEST(r.error().message().find('\x1b') == std::string::npos);
}

BOOST_AUTO_TEST_CASE(paste_is_bracketed_only_when_the_program_enabled_it) {
  BOOST_TEST(encode_paste("echo hi\nls", kNormal) == "echo hi\nls");
  BOOST_TEST(encode_paste("echo hi\nls", kBracketed) == "\x1b[200~echo hi\nls\x1b[201~");
  BOOST_TEST(encode_paste("", kBracketed) == "");
  BOOST_TEST(encode_paste("x", kAppCursor) == "x");
}

BOOST_AUTO_TEST_CASE(paste_end_marker_inside_the_text_is_stripped) {
  // The attack: text that ends the paste early and runs the rest as typed keys.
  BOOST_TEST(encode_paste("a\x1b[201~rm -rf ~\r", kBracketed) == "\x1b[200~arm -rf ~\r\x1b[201~");
  BOOST_TEST(encode_paste("a\x1b[201~b", kNormal) == "ab");
  BOOST_TEST(encode_paste("\x1b[200~x\x1b[201~", kBracketed) == "\x1b[200~x\x1b[201~");
  // Markers that only form once an inner one is removed are removed too.
  BOOST_TEST(encode_paste("\x1b[20\x1b[201~1~evil", kBracketed) == "\x1b[200~evil\x1b[201~");
  BOOST_TEST(encode_paste("\x1b[\x1b[\x1b[201~201~201~x", kBracketed) == "\x1b[200~x\x1b[201~");
  BOOST_TEST(encode_paste("\x1b[201~", kBracketed) == "");
  // Near misses stay.
  BOOST_TEST(encode_paste("\x1b[202~ [201~ \x1b[201", kNormal) == "\x1b[202~ [201~ \x1b[201");
  for (std::string_view text : {"x\x1b[201~\x1b[201~y", "\x1b[2\x1b[201~01~z"}) {
    std::string out = encode_paste(text, kBracketed);
    std::string inner = out.substr(6, out.size() - 12);
    BOOST_TEST(inner.find("\x1b[201~") == std::string::npos);
  }
}

// Failure fixed (a review, session 13): a ^C inside a paste reached the line discipline,
// which sent SIGINT (the program was killed mid-paste); ^D, ^U, ^W and DEL edit or end a line.
// Dropped are exactly the bytes the terminal's termios gives a meaning.
BOOST_AUTO_TEST_CASE(paste_drops_the_bytes_the_line_discipline_acts_on) {
  TerminalModes cooked = kNormal;
  cooked.line_controls = line_controls(fresh_pty_termios());
  BOOST_TEST(cooked.line_controls.size() == 11u);
  BOOST_TEST(encode_paste("line one\x03 rest", cooked) == "line one rest");
  BOOST_TEST(encode_paste("a\x04"
                          "b\x15"
                          "c\x17"
                          "d\x7f\x1a\x1c\x11\x13\x16\x12"
                          "e",
                          cooked) == "abcde");
  // Tab, newline, CR, ESC and other controls (^A) stay; so does UTF-8 text.
  BOOST_TEST(encode_paste("a\tb\nc\rd\x1b[1me\x01 \u00e9", cooked) ==
             "a\tb\nc\rd\x1b[1me\x01 \u00e9");
  // A raw-mode program (readline: no ICANON, no IXON, ISIG on) gets ^D and DEL as text.
  struct termios raw {};
  raw.c_lflag = ISIG;
  raw.c_cc[VINTR] = 0x03;
  raw.c_cc[VQUIT] = 0x1c;
  raw.c_cc[VSUSP] = 0x1a;
  raw.c_cc[VEOF] = 0x04;
  TerminalModes readline = kBracketed;
  readline.line_controls = line_controls(raw);
  BOOST_TEST(encode_paste("x\x03y\x04z\x7f", readline) == "\x1b[200~xy\x04z\x7f\x1b[201~");
  // A disabled character (_POSIX_VDISABLE, 0) is no control: NUL stays.
  BOOST_TEST(encode_paste(std::string("n\0m", 3), readline) ==
             "\x1b[200~" + std::string("n\0m", 3) + "\x1b[201~");
  // With ISTRIP the line discipline sees 0x83 as ^C (the second byte of U+00C3): dropped there,
  // kept where the high bit stays (found by a review, session 29).
  TerminalModes stripped = cooked;
  stripped.strip_high_bit = true;
  BOOST_TEST(encode_paste("A\xc3\x83"
                          "B",
                          stripped) ==
             "A\xc3"
             "B");
  BOOST_TEST(encode_paste("A\xc3\x83"
                          "B",
                          cooked) ==
             "A\xc3\x83"
             "B");
  // Nor can a paste end early with a marker that forms once the high bits are cleared.
  TerminalModes stripped_bracketed = stripped;
  stripped_bracketed.bracketed_paste = true;
  BOOST_TEST(encode_paste("x\x9b[201~y", stripped_bracketed) == "\x1b[200~xy\x1b[201~");
}

BOOST_AUTO_TEST_CASE(write_request_order_is_data_paste_keys_submit_eof) {
  WriteRequest req;
  req.data = "d";
  req.paste = "p";
  req.keys = {"Up", "C-c", "word"};
  req.submit = true;
  req.eof = true;
  auto r = encode_write(req, kBracketed);
  BOOST_REQUIRE(r.has_value());
  BOOST_TEST(*r == "d\x1b[200~p\x1b[201~\x1b[A\x03word\r\x04");
  auto app = encode_write(req, kAppCursor);
  BOOST_REQUIRE(app.has_value());
  BOOST_TEST(*app == "dp\x1bOA\x03word\r\x04");
}

BOOST_AUTO_TEST_CASE(single_fields_encode_alone) {
  WriteRequest submit_only;
  submit_only.submit = true;
  BOOST_TEST(encode_write(submit_only, kNormal).value() == "\r");
  WriteRequest eof_only;
  eof_only.eof = true;
  BOOST_TEST(encode_write(eof_only, kNormal).value() == "\x04");
  WriteRequest data_only;
  data_only.data = "caf\xc3\xa9\n";
  BOOST_TEST(encode_write(data_only, kBracketed).value() == "caf\xc3\xa9\n");
}

BOOST_AUTO_TEST_CASE(empty_request_is_invalid) {
  for (const WriteRequest& req :
       {WriteRequest{}, WriteRequest{.data = ""}, WriteRequest{.paste = "\x1b[201~"}}) {
    auto r = encode_write(req, kBracketed);
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST(static_cast<int>(r.error().code()) == static_cast<int>(ErrorCode::kInvalid));
    BOOST_TEST(r.error().message().find("nothing to write") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(bad_key_fails_the_whole_request_and_names_its_index) {
  WriteRequest req;
  req.data = "x";
  req.keys = {"Enter", "F13"};
  auto r = encode_write(req, kNormal);
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("keys[1]: key `F13`") == 0u, r.error().message());
}

// ---- ModeTracker ----------------------------------------------------------------------------

namespace {

struct Switch {
  std::string_view output;
  TerminalModes before, after;
};

bool same(const TerminalModes& a, const TerminalModes& b) {
  return a.application_cursor == b.application_cursor && a.bracketed_paste == b.bracketed_paste;
}

ModeTracker tracker_at(const TerminalModes& m) {
  ModeTracker t;
  if (m.application_cursor) {
    t.feed("\x1b[?1h");
  }
  if (m.bracketed_paste) {
    t.feed("\x1b[?2004h");
  }
  return t;
}

const TerminalModes kNone{};
const TerminalModes kBoth{.application_cursor = true, .bracketed_paste = true};

const std::vector<Switch> kSwitches = {
    {"\x1b[?1h", kNone, kAppCursor},
    {"\x1b[?1l", kAppCursor, kNone},
    {"\x1b[?2004h", kNone, kBracketed},
    {"\x1b[?2004l", kBracketed, kNone},
    {"\x1b[?1;2004h", kNone, kBoth},
    {"\x1b[?2004;1l", kBoth, kNone},
    {"\x1b[?1049;2004;1h", kNone, kBoth},  // alt screen too, as vim and less do
    // Surrounded by text and other sequences, as real programs write them.
    {"prompt\x1b[0m\x1b[?2004h$ ", kNone, kBracketed},
    {"\x1b[?1h\x1b=\x1b[H\x1b[2J", kNone, kAppCursor},  // smkx + clear, as readline/vim
    {"\x1b"
     "c",
     kBoth, kNone},                  // RIS
    {"\x1b[!p", kBoth, kBracketed},  // DECSTR
    // C0 controls inside a sequence are executed by a terminal and do not end it.
    {"\x1b[?20\r04h", kNone, kBracketed},
};

const std::vector<Switch> kNotSwitches = {
    {"\x1b[1h", kNone, kNone},    // ANSI mode 1, not DECCKM
    {"\x1b[?12h", kNone, kNone},  // cursor blink
    {"\x1b[?10h", kNone, kNone},
    {"\x1b[?2004", kNone, kNone},         // unfinished
    {"\x1b[?2004\x18h", kNone, kNone},    // CAN cancels it
    {"\x1b[?2004\x1b[mh", kNone, kNone},  // ESC aborts it
    {"\x1b[?1$h", kNone, kNone},          // intermediate: another sequence
    {"\x1b[?1:2h", kNone, kNone},         // sub-parameter
    {"\x1b[1?h", kNone, kNone},
    {"[?2004h ?1h", kNone, kNone},                  // no ESC
    {"\x1b[?99999999999999992004h", kNone, kNone},  // overflow does not wrap to 2004
    {"\x1b(c", kBoth, kBoth},                       // a charset designation ending in c is no reset
    {"\x1b[?2004h", kBracketed, kBracketed},
    {"\x1b[?1l", kNone, kNone},
};

}  // namespace

BOOST_AUTO_TEST_CASE(mode_tracker_sees_switches_fed_whole) {
  for (const auto* list : {&kSwitches, &kNotSwitches}) {
    for (const Switch& s : *list) {
      BOOST_TEST_CONTEXT("output " << s.output.size()
                                   << " bytes: " << std::string(s.output.substr(1))) {
        ModeTracker t = tracker_at(s.before);
        BOOST_REQUIRE(same(t.modes(), s.before));
        t.feed(s.output);
        BOOST_TEST(same(t.modes(), s.after));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(mode_tracker_handles_switches_split_at_every_byte_position) {
  for (const auto* list : {&kSwitches, &kNotSwitches}) {
    for (const Switch& s : *list) {
      for (size_t cut = 0; cut <= s.output.size(); ++cut) {
        BOOST_TEST_CONTEXT("output `" << std::string(s.output.substr(1)) << "` cut at " << cut) {
          ModeTracker t = tracker_at(s.before);
          t.feed(s.output.substr(0, cut));
          t.feed(s.output.substr(cut));
          BOOST_TEST(same(t.modes(), s.after));
        }
      }
      // And one byte per feed().
      ModeTracker t = tracker_at(s.before);
      for (char c : s.output) {
        t.feed(std::string_view(&c, 1));
      }
      BOOST_TEST(same(t.modes(), s.after));
    }
  }
}

BOOST_AUTO_TEST_CASE(mode_tracker_follows_a_sequence_of_switches) {
  ModeTracker t;
  std::string out = "hello\x1b[?2004hworld\x1b[?1h\x1b[?2004l\x1b[?1l\x1b[?1h";
  t.feed(out);
  BOOST_TEST(t.modes().application_cursor);
  BOOST_TEST(!t.modes().bracketed_paste);
  // The last switch wins; the mode drives the encoder.
  WriteRequest req;
  req.keys = {"Up"};
  BOOST_TEST(encode_write(req, t.modes()).value() == "\x1bOA");
  t.feed("\x1b[?1l");
  BOOST_TEST(encode_write(req, t.modes()).value() == "\x1b[A");
}
