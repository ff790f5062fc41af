//! The macros that declare the ABI: each records what the layout test needs
//! (`abi::tests`) next to the declaration, so that no type or constant escapes the test.

#![forbid(unsafe_code)]

/// A C layout record of one Rust type (used by the layout test).
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct TypeLayout {
    /// The Rust type name.
    pub rust: &'static str,
    /// The C type the record is measured against (`struct ibv_wc`).
    pub c_type: &'static str,
    /// Where the Rust type sits inside `c_type`: `""` for the type itself, a member path
    /// (`wr.atomic`) for a named nested struct or union, `"*"` for an anonymous union or
    /// struct (then its first field is the anchor and the size is not checked).
    pub base: &'static str,
    /// `size_of` the Rust type.
    pub size: usize,
    /// `align_of` the Rust type.
    pub align: usize,
    /// Field name (C name: a `u_` prefix of an anonymous member is dropped, `r#` removed)
    /// and Rust offset.
    pub fields: &'static [(&'static str, usize)],
}

/// Declares `#[repr(C)]` structs and unions with their C counterpart, for the layout
/// test: `@c("struct ibv_pd", "")`.
macro_rules! abi_types {
    ($(
        $(#[doc = $doc:literal])*
        @c($cty:literal, $base:literal)
        pub $kind:ident $name:ident {
            $( $(#[doc = $fdoc:literal])* pub $field:ident : $ty:ty ),* $(,)?
        }
    )*) => {
        $(
            abi_types!(@one [$($doc)*] $kind $name { $( [$($fdoc)*] $field : $ty ),* });
        )*
        /// Every declared type's layout record.
        #[cfg(test)]
        pub(crate) const TYPE_LAYOUTS: &[crate::abi::macros::TypeLayout] = &[$(
            crate::abi::macros::TypeLayout {
                rust: stringify!($name),
                c_type: $cty,
                base: $base,
                size: ::core::mem::size_of::<$name>(),
                align: ::core::mem::align_of::<$name>(),
                fields: &[$( (stringify!($field), ::core::mem::offset_of!($name, $field)) ),*],
            },
        )*];
    };
    (@one [$($doc:literal)*] struct $name:ident { $( [$($fdoc:literal)*] $field:ident : $ty:ty ),* }) => {
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct $name {
            $(
                #[doc = concat!("C field `", stringify!($field), "`.")]
                $(#[doc = $fdoc])*
                pub $field: $ty,
            )*
        }
    };
    (@one [$($doc:literal)*] union $name:ident { $( [$($fdoc:literal)*] $field:ident : $ty:ty ),* }) => {
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub union $name {
            $(
                #[doc = concat!("C member `", stringify!($field), "`.")]
                $(#[doc = $fdoc])*
                pub $field: $ty,
            )*
        }
    };
}

/// Declares the enum constants of verbs.h: groups `name: type { CONST = value, ... }`
/// (an anonymous C enum is written `ANON: type`), each value checked by the layout test.
macro_rules! abi_consts {
    ($(
        $(#[doc = $doc:literal])*
        $group:ident : $ty:ty { $( $cname:ident = $val:expr ),* $(,)? }
    )*) => {
        $(
            abi_consts!(@alias [$($doc)*] $group $ty);
            $(
                #[doc = concat!("`", stringify!($cname), "` (verbs.h).")]
                pub const $cname: $ty = $val;
            )*
        )*
        /// Every declared constant and its value.
        #[cfg(test)]
        pub(crate) const CONSTS: &[(&str, i128)] = &[$($( (stringify!($cname), $cname as i128) ),*),*];
    };
    (@alias [$($doc:literal)*] ANON $ty:ty) => {};
    (@alias [$($doc:literal)*] $group:ident $ty:ty) => {
        #[doc = concat!("C `enum ", stringify!($group), "` (a C enum is 4 bytes).")]
        $(#[doc = $doc])*
        pub type $group = $ty;
    };
}
