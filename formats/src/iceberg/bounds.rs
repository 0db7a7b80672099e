//! What a manifest says about a data file's values: column bounds in Iceberg's single-value
//! serialization, and the range of a source column that a partition value pins, as one-row Arrow
//! arrays for pruning and for columns a file does not hold.

use std::sync::Arc;

use apache_avro::types::Value;
use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, FixedSizeBinaryArray,
    Int32Array, Int64Array, StringArray, Time64MicrosecondArray, TimestampMicrosecondArray,
    TimestampNanosecondArray,
};
use arrow::datatypes::{DataType, TimeUnit};
use chrono::NaiveDate;

/// A one-row array of `value` as `data_type`, for the integer-backed types.
fn integer(value: i64, data_type: &DataType) -> Option<ArrayRef> {
    Some(match data_type {
        DataType::Int32 => Arc::new(Int32Array::from(vec![i32::try_from(value).ok()?])),
        DataType::Int64 => Arc::new(Int64Array::from(vec![value])),
        DataType::Date32 => Arc::new(Date32Array::from(vec![i32::try_from(value).ok()?])),
        DataType::Time64(TimeUnit::Microsecond) => {
            Arc::new(Time64MicrosecondArray::from(vec![value]))
        }
        DataType::Timestamp(TimeUnit::Microsecond, zone) => {
            Arc::new(TimestampMicrosecondArray::from(vec![value]).with_timezone_opt(zone.clone()))
        }
        DataType::Timestamp(TimeUnit::Nanosecond, zone) => {
            Arc::new(TimestampNanosecondArray::from(vec![value]).with_timezone_opt(zone.clone()))
        }
        _ => return None,
    })
}

fn decimal(unscaled: i128, data_type: &DataType) -> Option<ArrayRef> {
    let DataType::Decimal128(precision, scale) = data_type else {
        return None;
    };
    Decimal128Array::from(vec![unscaled])
        .with_precision_and_scale(*precision, *scale)
        .ok()
        .map(|array| Arc::new(array) as ArrayRef)
}

/// A big-endian two's complement integer of at most 16 bytes.
fn big_endian(bytes: &[u8]) -> Option<i128> {
    if bytes.is_empty() || bytes.len() > 16 {
        return None;
    }
    let fill = if bytes[0] & 0x80 == 0 { 0 } else { 0xFF };
    let mut wide = [fill; 16];
    wide[16 - bytes.len()..].copy_from_slice(bytes);
    Some(i128::from_be_bytes(wide))
}

/// Decodes a lower or upper bound of a column of `data_type`. Floating-point bounds are never
/// used: they leave NaN out, which the filter's ordering counts. A bound written when the column
/// had a narrower type (an `int` since promoted to `long`) decodes by its length.
pub(crate) fn bound(bytes: &[u8], data_type: &DataType) -> Option<ArrayRef> {
    let little = |bytes: &[u8]| -> Option<i64> {
        match bytes.len() {
            4 => Some(i64::from(i32::from_le_bytes(bytes.try_into().ok()?))),
            8 => Some(i64::from_le_bytes(bytes.try_into().ok()?)),
            _ => None,
        }
    };
    match data_type {
        DataType::Boolean => match bytes {
            [byte] => Some(Arc::new(BooleanArray::from(vec![*byte != 0]))),
            _ => None,
        },
        DataType::Int32 | DataType::Date32 if bytes.len() == 4 => {
            integer(little(bytes)?, data_type)
        }
        DataType::Int64 | DataType::Time64(_) | DataType::Timestamp(..) => {
            integer(little(bytes)?, data_type)
        }
        DataType::Utf8 => Some(Arc::new(StringArray::from(vec![
            std::str::from_utf8(bytes).ok()?,
        ]))),
        DataType::Binary => Some(Arc::new(BinaryArray::from(vec![bytes]))),
        DataType::FixedSizeBinary(length) if usize::try_from(*length).ok()? == bytes.len() => Some(
            Arc::new(FixedSizeBinaryArray::try_from_iter(std::iter::once(bytes)).ok()?),
        ),
        DataType::Decimal128(..) => decimal(big_endian(bytes)?, data_type),
        _ => None,
    }
}

/// A partition value (or an identity transform's source value) as a one-row array of
/// `data_type`.
pub(crate) fn value(value: &Value, data_type: &DataType) -> Option<ArrayRef> {
    match value {
        Value::Int(number) | Value::Date(number) => integer(i64::from(*number), data_type),
        Value::Long(number)
        | Value::TimeMicros(number)
        | Value::TimestampMicros(number)
        | Value::LocalTimestampMicros(number)
        | Value::TimestampNanos(number)
        | Value::LocalTimestampNanos(number) => integer(*number, data_type),
        Value::Boolean(flag) if *data_type == DataType::Boolean => {
            Some(Arc::new(BooleanArray::from(vec![*flag])))
        }
        Value::String(text) if *data_type == DataType::Utf8 => {
            Some(Arc::new(StringArray::from(vec![text.as_str()])))
        }
        Value::Bytes(bytes) | Value::Fixed(_, bytes) => match data_type {
            DataType::Decimal128(..) => decimal(big_endian(bytes)?, data_type),
            _ => bound(bytes, data_type),
        },
        Value::Decimal(unscaled) => {
            decimal(big_endian(&Vec::<u8>::try_from(unscaled).ok()?)?, data_type)
        }
        Value::Uuid(uuid) => bound(uuid.as_bytes(), data_type),
        _ => None,
    }
}

/// The first day of the month `months` months after January 1970, in days since the epoch.
fn month_start(months: i64) -> Option<i64> {
    let year = i32::try_from(1970 + months.div_euclid(12)).ok()?;
    let month = u32::try_from(months.rem_euclid(12)).ok()? + 1;
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
    Some(
        NaiveDate::from_ymd_opt(year, month, 1)?
            .signed_duration_since(epoch)
            .num_days(),
    )
}

/// The range `[first, last]` of a source column of `data_type` that a partition of
/// `transform` with value `partition` holds: both ends for `identity`, `year`, `month`, `day`,
/// `hour` and integer `truncate[W]`, the lower end alone for string `truncate[W]`, nothing for
/// `bucket[N]` and `void`.
pub(crate) fn partition_range(
    transform: &str,
    partition: &Value,
    data_type: &DataType,
) -> (Option<ArrayRef>, Option<ArrayRef>) {
    let number = match partition {
        Value::Int(number) | Value::Date(number) => Some(i64::from(*number)),
        Value::Long(number) => Some(*number),
        _ => None,
    };
    if transform == "identity" {
        let exact = value(partition, data_type);
        return (exact.clone(), exact);
    }
    if let Some(width) = transform
        .strip_prefix("truncate[")
        .and_then(|rest| rest.strip_suffix(']'))
        .and_then(|width| width.parse::<i64>().ok())
    {
        return match (data_type, number) {
            (DataType::Int32 | DataType::Int64, Some(start)) => (
                integer(start, data_type),
                start
                    .checked_add(width - 1)
                    .and_then(|end| integer(end, data_type)),
            ),
            (DataType::Utf8, _) => (value(partition, data_type), None),
            _ => (None, None),
        };
    }
    let Some(number) = number else {
        return (None, None);
    };
    // The period as days (for dates) or as microseconds, end exclusive.
    let days = match transform {
        "year" => month_start(number * 12).zip(month_start((number + 1) * 12)),
        "month" => month_start(number).zip(month_start(number + 1)),
        "day" => Some((number, number + 1)),
        _ => None,
    };
    const MICROS_PER_DAY: i64 = 86_400_000_000;
    const MICROS_PER_HOUR: i64 = 3_600_000_000;
    let micros = match transform {
        "hour" => Some((number * MICROS_PER_HOUR, (number + 1) * MICROS_PER_HOUR)),
        _ => days.map(|(start, end)| (start * MICROS_PER_DAY, end * MICROS_PER_DAY)),
    };
    let (start, end) = match data_type {
        DataType::Date32 => match days {
            Some(range) => range,
            None => return (None, None),
        },
        DataType::Timestamp(TimeUnit::Microsecond, _) => match micros {
            Some(range) => range,
            None => return (None, None),
        },
        DataType::Timestamp(TimeUnit::Nanosecond, _) => match micros {
            Some((start, end)) => (start * 1_000, end * 1_000),
            None => return (None, None),
        },
        _ => return (None, None),
    };
    (integer(start, data_type), integer(end - 1, data_type))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Array;
    use chrono::Datelike;

    /// The calendar date `days` days after the epoch.
    fn ymd(days: i64) -> (i32, u32, u32) {
        let date =
            NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch") + chrono::Duration::days(days);
        (date.year(), date.month(), date.day())
    }

    fn as_i64(array: &ArrayRef) -> i64 {
        let cast = arrow::compute::cast(array, &DataType::Int64).expect("cast");
        cast.as_any()
            .downcast_ref::<Int64Array>()
            .expect("int64")
            .value(0)
    }

    #[test]
    fn bounds_decode_iceberg_single_values() {
        let long = bound(&42i64.to_le_bytes(), &DataType::Int64).expect("long");
        assert_eq!(as_i64(&long), 42);
        let promoted = bound(&(-7i32).to_le_bytes(), &DataType::Int64).expect("int as long");
        assert_eq!(as_i64(&promoted), -7);
        let text = bound(b"abc", &DataType::Utf8).expect("string");
        assert_eq!(
            text.as_any()
                .downcast_ref::<StringArray>()
                .expect("utf8")
                .value(0),
            "abc"
        );
        // 12.34 as decimal(10, 2): unscaled 1234 = 0x04D2; -1 is one 0xFF byte.
        let price = bound(&[0x04, 0xD2], &DataType::Decimal128(10, 2)).expect("decimal");
        let price = price
            .as_any()
            .downcast_ref::<Decimal128Array>()
            .expect("decimal");
        assert_eq!(price.value(0), 1234);
        assert_eq!(price.scale(), 2);
        assert_eq!(big_endian(&[0xFF]), Some(-1));
        assert!(bound(&1.5f64.to_le_bytes(), &DataType::Float64).is_none());
        assert!(bound(&[1, 2, 3], &DataType::Int32).is_none(), "bad length");
        assert!(bound(&[0xFF, 0xFE], &DataType::Utf8).is_none(), "not UTF-8");
    }

    #[test]
    fn temporal_partitions_pin_the_whole_period_of_their_source_column() {
        let micros = DataType::Timestamp(TimeUnit::Microsecond, None);
        let day = 19_723; // 2024-01-01
        assert_eq!(ymd(day), (2024, 1, 1));
        let (first, last) = partition_range("day", &Value::Date(day as i32), &micros);
        assert_eq!(as_i64(&first.expect("first")), day * 86_400_000_000);
        assert_eq!(as_i64(&last.expect("last")), (day + 1) * 86_400_000_000 - 1);
        // Month 648 is 2024-01; 649 (February 2024) has 29 days.
        let (first, last) = partition_range("month", &Value::Int(649), &DataType::Date32);
        assert_eq!(ymd(as_i64(&first.expect("first"))), (2024, 2, 1));
        assert_eq!(ymd(as_i64(&last.expect("last"))), (2024, 2, 29));
        let (first, last) = partition_range("year", &Value::Int(-1), &DataType::Date32);
        assert_eq!(ymd(as_i64(&first.expect("first"))), (1969, 1, 1));
        assert_eq!(ymd(as_i64(&last.expect("last"))), (1969, 12, 31));
        let (first, last) = partition_range("hour", &Value::Int(2), &micros);
        assert_eq!(as_i64(&first.expect("first")), 7_200_000_000);
        assert_eq!(as_i64(&last.expect("last")), 10_800_000_000 - 1);
    }

    #[test]
    fn identity_and_truncate_pin_values_and_bucket_pins_nothing() {
        let (first, last) =
            partition_range("identity", &Value::String("b".into()), &DataType::Utf8);
        assert_eq!(first.as_ref().map(|array| array.len()), Some(1));
        assert_eq!(
            first.as_deref().map(Array::to_data),
            last.as_deref().map(Array::to_data)
        );
        let (first, last) = partition_range("truncate[10]", &Value::Long(30), &DataType::Int64);
        assert_eq!(as_i64(&first.expect("first")), 30);
        assert_eq!(as_i64(&last.expect("last")), 39);
        let (first, last) = partition_range("bucket[16]", &Value::Int(3), &DataType::Int64);
        assert!(first.is_none() && last.is_none());
        let (first, last) = partition_range("day", &Value::Null, &DataType::Date32);
        assert!(first.is_none() && last.is_none());
    }
}
