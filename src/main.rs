fn main() {
    println!("narad: server not built yet");
}
