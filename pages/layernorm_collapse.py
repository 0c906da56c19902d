import streamlit as st

st.title("LayerNorm collapse")
