#pragma once

// The terminal-input encoder behind `command_write` on a PTY job: turns a request (raw text,
// a paste, tmux-style key tokens, submit, EOF) into the exact bytes written to the pty master,
// and a tracker that watches the program's output for the two modes that change those bytes
// (DECCKM application cursor keys, bracketed paste).
//
// The bytes are xterm's (the program is expected to run with an xterm-compatible TERM such as
// xterm-256color); the token names are tmux send-keys'. Key table, with `m` the xterm modifier
// parameter 1 + (S ? 1 : 0) + (M ? 2 : 0) + (C ? 4 : 0):
//
//   token                      plain          application cursor   with modifiers (S-/M-/C-)
//   Up Down Right Left         ESC [ A..D     ESC O A..D           ESC [ 1 ; m A..D
//   Home End                   ESC [ H / F    ESC O H / F          ESC [ 1 ; m H / F
//   Insert (IC)                ESC [ 2 ~                           ESC [ 2 ; m ~
//   Delete (DC)                ESC [ 3 ~                           ESC [ 3 ; m ~
//   PageUp (PgUp, PPage)       ESC [ 5 ~                           ESC [ 5 ; m ~
//   PageDown (PgDn, NPage)     ESC [ 6 ~                           ESC [ 6 ; m ~
//   F1 F2 F3 F4                ESC O P..S                          ESC [ 1 ; m P..S
//   F5 F6 F7 F8                ESC [ 15 ~, 17 ~, 18 ~, 19 ~        ESC [ n ; m ~
//   F9 F10 F11 F12             ESC [ 20 ~, 21 ~, 23 ~, 24 ~        ESC [ n ; m ~
//   Enter                      CR             M-: ESC CR
//   Tab                        HT             S-: ESC [ Z; M-: ESC HT
//   BTab                       ESC [ Z        M-: ESC ESC [ Z
//   Escape                     ESC            M-: ESC ESC
//   Space                      SP             C-: NUL; M-: ESC SP
//   BSpace                     DEL (0x7f)     C-: BS (0x08); M-: ESC DEL
//   a single character x       x (UTF-8)      C-x: C0 control (below); S-x: upper case of an
//                                             ASCII letter; M-x: ESC before the rest
//   C-x / ^x for x in @..~     x & 0x1f (C-a and C-A are both 0x01, C-[ is ESC, C-@ is NUL)
//   C-? C-8 / ^?               DEL (0x7f)
//   C-Space C-2                NUL;  C-3..C-7: 0x1b..0x1f;  C-/ C--: 0x1f
//
// Names and modifier letters are case-insensitive ("enter", "c-x"); modifiers combine in any
// order ("C-M-x", "M-C-Left", "C-S-Up"). Meta on a key without an xterm parameter form is ESC
// prefixed (M-x → ESC x, M-C-x → ESC ^X). Combinations a legacy terminal cannot express
// (C-Enter, C-Tab, S-Escape, C-1, S-1, C-S-a, …) are errors, never silently a different key.
//
// Anything else is literal text, as tmux does with tokens it does not know: "hello", "-",
// "^" or "^ab" are written as they are. A token that starts with a modifier prefix ("C-",
// "M-", "S-" in either case) or looks like a function key ("F" and digits) must parse as a
// key; literal text that would look like one belongs in `data`.

#include <termios.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"

namespace cordon::engine {

/// The input-encoding modes the program running on the pty has switched on.
struct TerminalModes {
  bool application_cursor = false;  // DECCKM: ESC[?1h on, ESC[?1l off
  bool bracketed_paste = false;     // ESC[?2004h on, ESC[?2004l off
  // The bytes the pty's line discipline acts on now (its termios: VINTR… under ISIG, VEOF,
  // VERASE… under ICANON, VSTOP/VSTART under IXON); dropped from a paste. Empty: none.
  std::string line_controls;
  // ISTRIP: the line discipline clears each byte's high bit before it acts on it, so a paste's
  // 0x83 is ^C there (found by a review, session 29).
  bool strip_high_bit = false;
};

/// The bytes the line discipline of a terminal with termios `t` acts on (see
/// TerminalModes::line_controls); TAB, LF and CR never (a paste keeps its lines).
[[nodiscard]] std::string line_controls(const struct termios& t);
/// A fresh pty's termios, as far as input goes (ICRNL, IXON; ISIG, ICANON, IEXTEN, ECHO; the
/// default control characters): what a job's terminal is until its program changes it.
[[nodiscard]] struct termios fresh_pty_termios();

/// Watches what the program writes to the terminal for DECSET/DECRST of modes 1 and 2004
/// (several parameters in one sequence, e.g. ESC[?1;2004h, count), a full reset (ESC c: both
/// off) and a soft reset (ESC[!p: cursor keys back to normal). A sequence may be split across
/// feed() calls at any byte. Everything else is skipped, in constant memory.
class ModeTracker {
 public:
  /// Consumes the next chunk of program output; never fails.
  void feed(std::string_view output);
  const TerminalModes& modes() const { return modes_; }

 private:
  enum class State { kGround, kEscape, kEscapeIntermediate, kCsi, kCsiIgnore };
  void end_param();
  void dispatch_csi(char final_byte);

  TerminalModes modes_;
  State state_ = State::kGround;
  bool private_ = false;  // the CSI began with '?'
  bool first_csi_byte_ = false;
  char intermediate_ = 0;  // the last intermediate byte (0x20..0x2f), 0 if none
  unsigned param_ = 0;     // the parameter being read
  bool param_overflow_ = false;
  // Parameters seen so far that name a mode we track; applied when the final byte arrives
  // (kCsiIgnore throws them away if the sequence turns out to be something else).
  bool saw_cursor_mode_ = false, saw_paste_mode_ = false;
};

struct WriteRequest {
  std::optional<std::string> data;   // raw text, written as is
  std::optional<std::string> paste;  // bracketed when the program enabled bracketed paste
  std::vector<std::string> keys;     // tmux send-keys tokens (see the table above)
  bool submit = false;               // a final CR
  bool eof = false;                  // ^D (the default VEOF) after everything else
};

/// The bytes of one key token under `modes`; kInvalid naming the token and the accepted forms.
[[nodiscard]] Result<std::string> encode_key(std::string_view token, const TerminalModes& modes);

/// `text` as a terminal would paste it: the bytes the line discipline acts on now dropped
/// (`modes.line_controls`), every ESC[201~ (and ESC[200~) removed, even ones that
/// only form once an inner one is gone, so the text cannot end the paste early; wrapped in
/// ESC[200~ … ESC[201~ when bracketed paste is on. Empty text gives nothing.
[[nodiscard]] std::string encode_paste(std::string_view text, const TerminalModes& modes);

/// The whole request in the order data, paste, keys, submit, eof. kInvalid for a request that
/// would write nothing or for a malformed key token.
[[nodiscard]] Result<std::string> encode_write(const WriteRequest& request,
                                               const TerminalModes& modes);

}  // namespace cordon::engine
