//! Type names as job specs write them (`cast: {column: x, to: float32}`), and the Arrow types they name.

use arrow::datatypes::DataType;

/// The type names [`data_type_by_name`] knows.
pub const DATA_TYPE_NAMES: &[&str] = &[
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "string",
    "large_string",
    "binary",
    "large_binary",
    "date32",
];

/// The Arrow type a type name stands for, or `None` for a name not in [`DATA_TYPE_NAMES`].
pub fn data_type_by_name(name: &str) -> Option<DataType> {
    Some(match name {
        "bool" => DataType::Boolean,
        "int8" => DataType::Int8,
        "int16" => DataType::Int16,
        "int32" => DataType::Int32,
        "int64" => DataType::Int64,
        "uint8" => DataType::UInt8,
        "uint16" => DataType::UInt16,
        "uint32" => DataType::UInt32,
        "uint64" => DataType::UInt64,
        "float16" => DataType::Float16,
        "float32" => DataType::Float32,
        "float64" => DataType::Float64,
        "string" => DataType::Utf8,
        "large_string" => DataType::LargeUtf8,
        "binary" => DataType::Binary,
        "large_binary" => DataType::LargeBinary,
        "date32" => DataType::Date32,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_names_a_type_and_no_other_does() {
        let mut types: Vec<DataType> = DATA_TYPE_NAMES
            .iter()
            .map(|name| data_type_by_name(name).unwrap_or_else(|| panic!("{name}")))
            .collect();
        types.dedup();
        assert_eq!(
            types.len(),
            DATA_TYPE_NAMES.len(),
            "names are distinct types"
        );
        assert_eq!(data_type_by_name("Float32"), None);
        assert_eq!(data_type_by_name("double"), None);
    }
}
