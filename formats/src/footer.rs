//! What a Parquet footer may claim before its claims are used.
//!
//! A footer's fields are the file's word about its bytes, and a reader sizes reads, buffers and
//! plans by them: a column chunk's offset and compressed size become the range a read fetches (and
//! allocates), a row group's row count becomes the plan's tasks. So a footer is checked once, as it
//! is read and before anything uses it, against what the file's bytes can back:
//!
//! - every count and size is non-negative, and the file's row count is 0 (as some writers leave
//!   it) or its row groups' sum;
//! - every column chunk (from its dictionary page, or its first data page, on for its compressed
//!   size) lies inside the file, and so do the page indexes and bloom filters the footer points at;
//! - a column chunk holds no more values than its pages can: a data page header carries its value
//!   count as an `i32` and takes at least [`MIN_PAGE_BYTES`], so a chunk of `n` bytes holds at most
//!   `n / MIN_PAGE_BYTES * i32::MAX` values;
//! - a row group holds no more rows than any of its column chunks holds values, since every row
//!   puts at least one value (null or not) in every leaf column.
//!
//! A row count that passes is still believed only as the pages deliver it: run-length encoding
//! packs billions of rows in a few bytes, so no length of the file bounds a row count tightly. A
//! read whose decoder ends before the rows the footer claims fails with
//! [`FormatError::RowsMissing`], bad data covering the rows claimed; and the plan bounds the number
//! of splits it makes ([`crate::plan::MAX_PLAN_SPLITS`]) before it makes any.
//!
//! A footer that fails is bad data ([`FormatError::ParquetFooter`]): a clean error naming the file
//! and the field, and a file a job leaves out under `data.on_bad_data`.

use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};

use crate::error::{FormatError, Result};

/// The fewest bytes a data page takes: its header alone, in Thrift's compact protocol, is at least
/// 17 bytes (type, both sizes and a data page header with its value count and three encodings).
pub(crate) const MIN_PAGE_BYTES: i64 = 16;

/// Checks the claims of the footer of the file `uri` of `file_size` bytes (see the module's
/// documentation).
///
/// # Errors
///
/// Returns [`FormatError::ParquetFooter`] naming the first field that claims more than the file holds.
pub(crate) fn check(uri: &str, file_size: u64, metadata: &ParquetMetaData) -> Result<()> {
    let lie = |field: String, value: i64, reason: String| FormatError::ParquetFooter {
        file: uri.to_string(),
        field,
        value,
        reason,
    };
    let file_rows = metadata.file_metadata().num_rows();
    if file_rows < 0 {
        return Err(lie(
            "num_rows".to_string(),
            file_rows,
            "a row count cannot be negative".to_string(),
        ));
    }
    let file_size = i64::try_from(file_size).unwrap_or(i64::MAX);
    let mut total_rows = 0i64;
    for (group_index, group) in metadata.row_groups().iter().enumerate() {
        let group_field = |name: &str| format!("row_groups[{group_index}].{name}");
        let rows = group.num_rows();
        if rows < 0 {
            return Err(lie(
                group_field("num_rows"),
                rows,
                "a row count cannot be negative".to_string(),
            ));
        }
        total_rows = total_rows.checked_add(rows).ok_or_else(|| {
            lie(
                group_field("num_rows"),
                rows,
                format!("the row groups up to it claim more than {} rows", i64::MAX),
            )
        })?;
        for (column_index, column) in group.columns().iter().enumerate() {
            let field = |name: &str| {
                format!("row_groups[{group_index}].columns[{column_index}].meta_data.{name}")
            };
            check_column(column, file_size).map_err(|(name, value, reason)| {
                lie(
                    field(name),
                    value,
                    format!("{reason} ({})", column.column_path()),
                )
            })?;
            if rows > column.num_values() {
                return Err(lie(
                    group_field("num_rows"),
                    rows,
                    format!(
                        "more rows than column {} holds values (its num_values is {}), and every row holds a value in every column",
                        column.column_path(),
                        column.num_values()
                    ),
                ));
            }
        }
    }
    // Some writers leave the file's count at 0; any other count is its row groups' sum.
    if file_rows != 0 && file_rows != total_rows {
        return Err(lie(
            "num_rows".to_string(),
            file_rows,
            format!("the row groups hold {total_rows} rows"),
        ));
    }
    Ok(())
}

/// What is wrong with one field of a column chunk: its name, its value and why.
type ColumnLie = (&'static str, i64, String);

fn check_column(
    column: &ColumnChunkMetaData,
    file_size: i64,
) -> std::result::Result<(), ColumnLie> {
    let non_negative = |name: &'static str, value: i64| {
        if value < 0 {
            Err((
                name,
                value,
                "a count or an offset cannot be negative".to_string(),
            ))
        } else {
            Ok(())
        }
    };
    non_negative("num_values", column.num_values())?;
    non_negative("total_compressed_size", column.compressed_size())?;
    non_negative("total_uncompressed_size", column.uncompressed_size())?;
    non_negative("data_page_offset", column.data_page_offset())?;
    if let Some(offset) = column.dictionary_page_offset() {
        non_negative("dictionary_page_offset", offset)?;
    }
    let start = column
        .dictionary_page_offset()
        .unwrap_or(column.data_page_offset());
    let size = column.compressed_size();
    if start.checked_add(size).is_none_or(|end| end > file_size) {
        return Err((
            "total_compressed_size",
            size,
            format!(
                "the column chunk from byte {start} on would end past the file's {file_size} bytes"
            ),
        ));
    }
    if column.data_page_offset() >= file_size {
        return Err((
            "data_page_offset",
            column.data_page_offset(),
            format!("the first data page would start past the file's {file_size} bytes"),
        ));
    }
    let most_values = (size / MIN_PAGE_BYTES).saturating_mul(i64::from(i32::MAX));
    if column.num_values() > most_values {
        return Err((
            "num_values",
            column.num_values(),
            format!(
                "more values than a column chunk of {size} bytes can hold (at most {most_values}: a page of at most {} values takes at least {MIN_PAGE_BYTES} bytes)",
                i32::MAX
            ),
        ));
    }
    let within =
        |name: &'static str, offset: Option<i64>, length: Option<i32>| match (offset, length) {
            (Some(offset), length) => {
                let length = i64::from(length.unwrap_or(0));
                if offset < 0 || length < 0 {
                    return Err((
                        name,
                        offset.min(length),
                        "an offset or a length cannot be negative".to_string(),
                    ));
                }
                match offset.checked_add(length) {
                    Some(end) if end <= file_size => Ok(()),
                    _ => Err((
                        name,
                        offset,
                        format!("{length} bytes from there end past the file's {file_size} bytes"),
                    )),
                }
            }
            (None, _) => Ok(()),
        };
    within(
        "offset_index_offset",
        column.offset_index_offset(),
        column.offset_index_length(),
    )?;
    within(
        "column_index_offset",
        column.column_index_offset(),
        column.column_index_length(),
    )?;
    within(
        "bloom_filter_offset",
        column.bloom_filter_offset(),
        column.bloom_filter_length(),
    )?;
    Ok(())
}

/// Checks the offset index of a footer's page index, when it was loaded: each page lies inside its
/// column chunk, and pages start at rows that rise from 0 within their row group.
///
/// # Errors
///
/// Returns [`FormatError::ParquetFooter`] naming the first page location that lies.
pub(crate) fn check_page_index(uri: &str, metadata: &ParquetMetaData) -> Result<()> {
    if metadata.page_index().is_none() {
        return Ok(());
    }
    for (group_index, group) in metadata.row_groups().iter().enumerate() {
        let page_index = metadata.page_index_for_row_group(group_index);
        for (column_index, column) in group.columns().iter().enumerate() {
            let Some(index) = page_index.offset_index(column_index) else {
                continue;
            };
            let start = column
                .dictionary_page_offset()
                .unwrap_or(column.data_page_offset());
            let end = start.saturating_add(column.compressed_size());
            let mut previous_row = 0i64;
            for (page, location) in index.page_locations().iter().enumerate() {
                let lie = |name: &str, value: i64, reason: String| FormatError::ParquetFooter {
                    file: uri.to_string(),
                    field: format!(
                        "offset index of row_groups[{group_index}].columns[{column_index}]: page_locations[{page}].{name}"
                    ),
                    value,
                    reason,
                };
                let page_end = location
                    .offset
                    .checked_add(i64::from(location.compressed_page_size));
                if location.offset < start
                    || location.compressed_page_size < 0
                    || page_end.is_none_or(|page_end| page_end > end)
                {
                    return Err(lie(
                        "offset",
                        location.offset,
                        format!(
                            "the page of {} bytes there lies outside its column chunk, bytes {start}..{end}",
                            location.compressed_page_size
                        ),
                    ));
                }
                let first_row = location.first_row_index;
                let rises = if page == 0 {
                    first_row == 0
                } else {
                    first_row >= previous_row
                };
                if !rises || first_row >= group.num_rows().max(1) {
                    return Err(lie(
                        "first_row_index",
                        first_row,
                        format!(
                            "pages start at row 0, then at rows that never fall, below the row group's {} rows",
                            group.num_rows()
                        ),
                    ));
                }
                previous_row = first_row;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};

    /// Every file of the conformance data that the reader reads (not encrypted, a supported
    /// footer) passes the checks, its page index included: the checks refuse lies, not writers.
    #[test]
    fn the_conformance_files_pass_the_footer_checks() {
        let directory = sluice_testkit::testdata().join("parquet/data");
        let mut checked = 0;
        for entry in std::fs::read_dir(&directory).expect("the conformance data") {
            let path = entry.expect("an entry").path();
            if path
                .extension()
                .is_none_or(|extension| extension != "parquet")
            {
                continue;
            }
            let file = std::fs::File::open(&path).expect("open");
            let size = file.metadata().expect("metadata").len();
            let Ok(metadata) = ParquetMetaDataReader::new()
                .with_offset_index_policy(PageIndexPolicy::Optional)
                .parse_and_finish(&file)
            else {
                continue;
            };
            let uri = path.display().to_string();
            check(&uri, size, &metadata).unwrap_or_else(|error| panic!("{error}"));
            check_page_index(&uri, &metadata).unwrap_or_else(|error| panic!("{error}"));
            checked += 1;
        }
        assert!(checked >= 50, "only {checked} conformance files were read");
    }
}
