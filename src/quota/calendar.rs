//! Calendar windows: where a fixed window with `calendar:` starts and ends.
//!
//! The reference's `month` is 30 days counted from the epoch, so "10,000 calls in December"
//! cannot be said with it. A calendar window is a day, an ISO week (from Monday), a month or a
//! year of the civil calendar, at UTC or at a fixed UTC offset (`+09:00`), so every window
//! starts at local midnight. Time zones with daylight saving are not offered: their day
//! lengths need the zone rules inside the Redis script, which has none.
//!
//! Data flow: the rules read `calendar:` into a [`Calendar`] on the limit's rate (`rules/`
//! re-exports it); the limiter
//! makes it an `OpKind::CalendarWindow`; the memory store's bucket math
//! (`quota/bucket/fixed_window.rs`) asks [`Calendar::start`] and [`Calendar::next`] for the
//! window at its clock, and `lua/fixed_window.lua` computes the same two numbers from Redis's
//! `TIME` with the same integer arithmetic (`tests/lua_mirror.rs` holds them together). The
//! dates are Howard Hinnant's `days_from_civil` / `civil_from_days` (proleptic Gregorian: leap
//! years every 4, not every 100, every 400).

use std::fmt;

use serde::Serialize;

const DAY_MS: i64 = 86_400_000;

/// The calendar unit of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CalendarUnit {
    Day,
    /// An ISO week: Monday 00:00 to the next Monday.
    Week,
    Month,
    Year,
}

impl CalendarUnit {
    /// The number `lua/fixed_window.lua` knows the unit by (0 is a plain fixed window).
    pub fn code(self) -> u64 {
        match self {
            CalendarUnit::Day => 1,
            CalendarUnit::Week => 2,
            CalendarUnit::Month => 3,
            CalendarUnit::Year => 4,
        }
    }
}

/// Where a calendar window starts: its unit, at a fixed offset from UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Calendar {
    pub unit: CalendarUnit,
    /// Minutes east of UTC, within ±18 hours (`+09:00` is 540).
    pub offset_min: i16,
}

/// The widest UTC offset accepted, in minutes (ISO 8601 and every zone in use fit in ±18 h).
pub const MAX_OFFSET_MIN: i16 = 18 * 60;

impl Calendar {
    /// The start (epoch ms) of the window holding `now_ms`.
    pub fn start(self, now_ms: u64) -> u64 {
        let offset = i64::from(self.offset_min) * 60_000;
        let local = now_ms as i64 + offset;
        let days = local.div_euclid(DAY_MS);
        let start_day = match self.unit {
            CalendarUnit::Day => days,
            // 1970-01-01 was a Thursday: (days + 3) mod 7 is the days since Monday.
            CalendarUnit::Week => days - (days + 3).rem_euclid(7),
            CalendarUnit::Month => {
                let (y, m, _) = civil_from_days(days);
                days_from_civil(y, m, 1)
            }
            CalendarUnit::Year => {
                let (y, _, _) = civil_from_days(days);
                days_from_civil(y, 1, 1)
            }
        };
        (start_day * DAY_MS - offset).max(0) as u64
    }

    /// The start of the window after the one starting at `start_ms` (a value of
    /// [`Calendar::start`]): its end.
    pub fn next(self, start_ms: u64) -> u64 {
        let offset = i64::from(self.offset_min) * 60_000;
        let days = (start_ms as i64 + offset).div_euclid(DAY_MS);
        let next_day = match self.unit {
            CalendarUnit::Day => days + 1,
            CalendarUnit::Week => days + 7,
            CalendarUnit::Month => {
                let (y, m, _) = civil_from_days(days);
                if m == 12 {
                    days_from_civil(y + 1, 1, 1)
                } else {
                    days_from_civil(y, m + 1, 1)
                }
            }
            CalendarUnit::Year => {
                let (y, _, _) = civil_from_days(days);
                days_from_civil(y + 1, 1, 1)
            }
        };
        (next_day * DAY_MS - offset).max(0) as u64
    }

    /// The offset as the script takes it: minutes + [`MAX_OFFSET_MIN`], never negative.
    pub fn offset_arg(self) -> u64 {
        (i64::from(self.offset_min) + i64::from(MAX_OFFSET_MIN)) as u64
    }

    /// Reads a rule's `calendar:` value: `utc` (or `UTC`), or an offset `+HH:MM` / `-HH:MM`
    /// (`UTC+09:00` too). The error says what is accepted.
    pub fn parse_offset(s: &str) -> Result<i16, String> {
        let t = s.trim();
        let bad = || {
            format!(
                "'{s}' is not a calendar offset: use utc, or a fixed offset from UTC such as +09:00 or -05:30 (time zones with daylight saving are not offered)"
            )
        };
        if t.is_empty() {
            return Err(bad());
        }
        let rest = t
            .strip_prefix("UTC")
            .or_else(|| t.strip_prefix("utc"))
            .unwrap_or(t);
        if rest.is_empty() {
            return Ok(0);
        }
        let (sign, hm) = match rest.as_bytes()[0] {
            b'+' => (1, &rest[1..]),
            b'-' => (-1, &rest[1..]),
            _ => return Err(bad()),
        };
        let (h, m) = hm.split_once(':').ok_or_else(bad)?;
        let digits = |t: &str| t.len() == 2 && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(h) || !digits(m) {
            return Err(bad());
        }
        let (h, m): (i16, i16) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
        if m >= 60 || h * 60 + m > MAX_OFFSET_MIN {
            return Err(bad());
        }
        Ok(sign * (h * 60 + m))
    }
}

impl fmt::Display for Calendar {
    /// `month UTC`, `day UTC+09:00`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.unit {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        };
        let o = self.offset_min;
        if o == 0 {
            write!(f, "{unit} UTC")
        } else {
            let sign = if o < 0 { '-' } else { '+' };
            let a = o.unsigned_abs();
            write!(f, "{unit} UTC{sign}{:02}:{:02}", a / 60, a % 60)
        }
    }
}

/// Days since 1970-01-01 of the civil date `y`-`m`-`d` (Hinnant's `days_from_civil`).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date `(y, m, d)` of `days` since 1970-01-01 (Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Epoch ms of `y-m-d hh:mm` UTC.
    fn at(y: i64, m: i64, d: i64, hh: i64, mm: i64) -> u64 {
        (days_from_civil(y, m, d) * DAY_MS + (hh * 60 + mm) * 60_000) as u64
    }

    fn utc(unit: CalendarUnit) -> Calendar {
        Calendar {
            unit,
            offset_min: 0,
        }
    }

    #[test]
    fn civil_dates_round_trip_over_four_centuries() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(
            days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 28),
            2,
            "2000 leaps"
        );
        assert_eq!(
            days_from_civil(2100, 3, 1) - days_from_civil(2100, 2, 28),
            1,
            "2100 does not"
        );
        for days in (days_from_civil(1970, 1, 1)..days_from_civil(2370, 1, 1)).step_by(13) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn months_have_their_lengths_and_leap_februaries() {
        let month = utc(CalendarUnit::Month);
        let now = at(2026, 12, 7, 0, 10);
        assert_eq!(month.start(now), at(2026, 12, 1, 0, 0));
        assert_eq!(
            month.next(month.start(now)),
            at(2027, 1, 1, 0, 0),
            "December ends the year"
        );
        for (y, m, days) in [
            (2027, 2, 28),
            (2028, 2, 29),
            (2100, 2, 28),
            (2000, 2, 29),
            (2026, 4, 30),
            (2026, 7, 31),
        ] {
            let start = month.start(at(y, m, 15, 12, 0));
            assert_eq!(start, at(y, m, 1, 0, 0));
            assert_eq!(month.next(start) - start, days * DAY_MS as u64, "{y}-{m}");
        }
        // The last millisecond of a month is in it; the next is the next month's first.
        let end = at(2028, 3, 1, 0, 0);
        assert_eq!(month.start(end - 1), at(2028, 2, 1, 0, 0));
        assert_eq!(month.start(end), end);
    }

    #[test]
    fn days_weeks_and_years() {
        let now = at(2026, 12, 7, 15, 30); // a Monday
        assert_eq!(utc(CalendarUnit::Day).start(now), at(2026, 12, 7, 0, 0));
        let week = utc(CalendarUnit::Week);
        assert_eq!(
            week.start(now),
            at(2026, 12, 7, 0, 0),
            "Monday starts the week"
        );
        assert_eq!(
            week.start(at(2026, 12, 13, 23, 59)),
            at(2026, 12, 7, 0, 0),
            "Sunday"
        );
        assert_eq!(week.next(at(2026, 12, 7, 0, 0)), at(2026, 12, 14, 0, 0));
        let year = utc(CalendarUnit::Year);
        assert_eq!(year.start(now), at(2026, 1, 1, 0, 0));
        assert_eq!(
            year.next(at(2028, 1, 1, 0, 0)) - at(2028, 1, 1, 0, 0),
            366 * DAY_MS as u64
        );
    }

    #[test]
    fn an_offset_moves_midnight() {
        let tokyo = Calendar {
            unit: CalendarUnit::Month,
            offset_min: 540,
        };
        // 2026-11-30 16:00 UTC is December 1st, 01:00 in Tokyo.
        assert_eq!(
            tokyo.start(at(2026, 11, 30, 16, 0)),
            at(2026, 11, 30, 15, 0)
        );
        assert_eq!(
            tokyo.start(at(2026, 11, 30, 14, 59)),
            at(2026, 10, 31, 15, 0)
        );
        let new_york_day = Calendar {
            unit: CalendarUnit::Day,
            offset_min: -300,
        };
        assert_eq!(
            new_york_day.start(at(2026, 12, 7, 3, 0)),
            at(2026, 12, 6, 5, 0)
        );
        assert_eq!(
            new_york_day.next(at(2026, 12, 6, 5, 0)),
            at(2026, 12, 7, 5, 0)
        );
        assert_eq!(tokyo.offset_arg(), 540 + 1080);
        assert_eq!(new_york_day.to_string(), "day UTC-05:00");
    }

    #[test]
    fn offsets_parse_or_say_what_is_accepted() {
        for (s, want) in [
            ("utc", 0),
            ("UTC", 0),
            ("+09:00", 540),
            ("UTC+05:30", 330),
            ("-05:00", -300),
            ("+18:00", 1080),
        ] {
            assert_eq!(Calendar::parse_offset(s), Ok(want), "{s}");
        }
        for s in [
            "Europe/Berlin",
            "+9",
            "+09:60",
            "+18:01",
            "09:00",
            "",
            "+0900",
        ] {
            let e = Calendar::parse_offset(s);
            assert!(
                e.as_ref().is_err_and(|e| e.contains("+09:00")),
                "{s}: {e:?}"
            );
        }
    }
}
