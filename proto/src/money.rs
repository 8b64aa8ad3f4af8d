//! Exact decimal amounts: money is counted in pico-dollars (10^-12 USD) as
//! integers everywhere, and written by people as decimal USD. [`parse_decimal`]
//! reads `"2.50"` into an integer of a fixed scale without floats (budgets in
//! the CLI, prices in the operator's configuration); [`usd`] writes
//! pico-dollars back as decimal USD.

/// Pico-dollars in one US dollar.
pub const PICO_PER_USD: u64 = 1_000_000_000_000;

/// Why a decimal text was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecimalError {
    /// Empty, or not digits with at most one `.` between digits.
    Malformed,
    /// A `-` sign: amounts are never negative.
    Negative,
    /// More digits after the point than the scale allows.
    TooManyDecimals { max: u32 },
    /// Does not fit in 64 bits at the scale.
    TooLarge,
}

impl std::fmt::Display for DecimalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecimalError::Malformed => {
                f.write_str("not a decimal number (digits, one optional '.')")
            }
            DecimalError::Negative => f.write_str("must not be negative"),
            DecimalError::TooManyDecimals { max } => {
                write!(f, "at most {max} digits after the decimal point")
            }
            DecimalError::TooLarge => f.write_str("too large"),
        }
    }
}

impl std::error::Error for DecimalError {}

/// Parses a non-negative decimal (`"3"`, `"0.30"`, `"3.75"`) with at most
/// `scale` digits after the point into the integer `value × 10^scale`,
/// exactly: `parse_decimal("2.5", 12)` is 2.5 USD in pico-dollars.
pub fn parse_decimal(text: &str, scale: u32) -> Result<u64, DecimalError> {
    let text = text.trim();
    if text.starts_with('-') {
        return Err(DecimalError::Negative);
    }
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) => (w, f),
        None => (text, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || text.ends_with('.') {
        return Err(DecimalError::Malformed);
    }
    if fraction.len() > scale as usize {
        return Err(DecimalError::TooManyDecimals { max: scale });
    }
    let unit = 10u64.checked_pow(scale).ok_or(DecimalError::TooLarge)?;
    let mut value = 0u64;
    for b in whole.bytes() {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or(DecimalError::TooLarge)?;
    }
    let mut value = value.checked_mul(unit).ok_or(DecimalError::TooLarge)?;
    let mut place = unit;
    for b in fraction.bytes() {
        place /= 10;
        value = value
            .checked_add(u64::from(b - b'0') * place)
            .ok_or(DecimalError::TooLarge)?;
    }
    Ok(value)
}

/// Writes pico-dollars as decimal USD with no trailing zeros past the
/// cents: `2_500_000_000_000` is `"2.50"`, `1` is `"0.000000000001"`.
pub fn usd(pico: u64) -> String {
    let whole = pico / PICO_PER_USD;
    let fraction = format!("{:012}", pico % PICO_PER_USD);
    let fraction = fraction.trim_end_matches('0');
    let fraction = if fraction.len() < 2 {
        format!("{fraction:0<2}")
    } else {
        fraction.to_owned()
    };
    format!("{whole}.{fraction}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_parse_exactly() {
        assert_eq!(parse_decimal("3", 6), Ok(3_000_000));
        assert_eq!(parse_decimal("0.30", 6), Ok(300_000));
        assert_eq!(parse_decimal("3.75", 6), Ok(3_750_000));
        assert_eq!(parse_decimal("0.000001", 6), Ok(1));
        assert_eq!(parse_decimal("2.50", 12), Ok(2_500_000_000_000));
        assert_eq!(parse_decimal("0", 12), Ok(0));
        assert_eq!(parse_decimal(" 15 ", 6), Ok(15_000_000));
    }

    #[test]
    fn bad_decimals_are_refused() {
        assert_eq!(parse_decimal("-1", 6), Err(DecimalError::Negative));
        assert_eq!(parse_decimal("-0.5", 6), Err(DecimalError::Negative));
        assert_eq!(
            parse_decimal("0.0000001", 6),
            Err(DecimalError::TooManyDecimals { max: 6 })
        );
        for bad in [
            "", ".", "1.", ".5", "1.2.3", "abc", "1e3", "+1", "1,5", "0x10", " ",
        ] {
            assert_eq!(
                parse_decimal(bad, 6),
                Err(DecimalError::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_decimal("99999999999999999999", 0),
            Err(DecimalError::TooLarge)
        );
        assert_eq!(parse_decimal("20000000", 12), Err(DecimalError::TooLarge));
    }

    #[test]
    fn usd_is_written_to_the_cent_at_least() {
        assert_eq!(usd(0), "0.00");
        assert_eq!(usd(2_500_000_000_000), "2.50");
        assert_eq!(usd(12_207_000_000), "0.012207");
        assert_eq!(usd(1), "0.000000000001");
        assert_eq!(usd(3 * PICO_PER_USD), "3.00");
    }
}
