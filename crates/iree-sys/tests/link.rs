//! Link smoke test: the bindings resolve against the installed static runtime,
//! an instance with all drivers can be created, and the CPU drivers are listed.

use iree_sys as sys;
use std::ptr;

fn driver_names(registry: *mut sys::iree_hal_driver_registry_t) -> Vec<String> {
    let mut count: sys::iree_host_size_t = 0;
    let mut infos: *mut sys::iree_hal_driver_info_t = ptr::null_mut();
    // SAFETY: registry is a live registry; out-pointers are valid locals.
    let status =
        unsafe { sys::iree_hal_driver_registry_enumerate(registry, sys::allocator_system(), &mut count, &mut infos) };
    assert!(sys::status_is_ok(status), "enumerate failed with code {}", sys::status_code(status));
    let mut names = Vec::new();
    for i in 0..count {
        // SAFETY: enumerate returned `count` initialised entries at `infos`.
        let info = unsafe { &*infos.add(i) };
        // SAFETY: the driver name view points into the registry's static storage.
        let bytes = unsafe { std::slice::from_raw_parts(info.driver_name.data.cast::<u8>(), info.driver_name.size) };
        names.push(String::from_utf8_lossy(bytes).into_owned());
    }
    // SAFETY: the list was allocated with the system allocator by enumerate.
    unsafe { sys::iree_allocator_free(sys::allocator_system(), infos.cast()) };
    names
}

#[test]
fn instance_lists_cpu_drivers() {
    let mut options = sys::iree_runtime_instance_options_t::default();
    // SAFETY: options is a valid, exclusively borrowed struct.
    unsafe {
        sys::iree_runtime_instance_options_initialize(&mut options);
        sys::iree_runtime_instance_options_use_all_available_drivers(&mut options);
    }
    let mut instance: *mut sys::iree_runtime_instance_t = ptr::null_mut();
    // SAFETY: options was initialised above; instance is a valid out-pointer.
    let status = unsafe { sys::iree_runtime_instance_create(&options, sys::allocator_system(), &mut instance) };
    assert!(sys::status_is_ok(status));
    assert!(!instance.is_null());
    // SAFETY: instance is live.
    let registry = unsafe { sys::iree_runtime_instance_driver_registry(instance) };
    let names = driver_names(registry);
    assert!(names.iter().any(|n| n == "local-sync"), "drivers: {names:?}");
    assert!(names.iter().any(|n| n == "local-task"), "drivers: {names:?}");
    // SAFETY: we own the one reference created above.
    unsafe { sys::iree_runtime_instance_release(instance) };
}

#[test]
fn status_code_and_message_round_trip() {
    let message = "tensor `w` missing";
    // SAFETY: the format string is a NUL-terminated literal taking one `%.*s`.
    let status = unsafe {
        sys::iree_status_allocate_f(
            sys::IREE_STATUS_NOT_FOUND,
            c"test.c".as_ptr(),
            1,
            c"%.*s".as_ptr(),
            message.len() as i32,
            message.as_ptr(),
        )
    };
    assert_eq!(sys::status_code(status), sys::IREE_STATUS_NOT_FOUND);
    let mut buffer = vec![0u8; 256];
    let mut length: sys::iree_host_size_t = 0;
    // SAFETY: buffer has the stated capacity; status is live until freed below.
    let ok = unsafe { sys::iree_status_format(status, buffer.len(), buffer.as_mut_ptr().cast(), &mut length) };
    assert!(ok);
    let text = String::from_utf8_lossy(&buffer[..length]).into_owned();
    assert!(text.contains("NOT_FOUND") && text.contains(message), "{text}");
    // SAFETY: status is owned here and freed once.
    unsafe { sys::iree_status_free(status) };
}
